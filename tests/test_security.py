"""A hostile local user against the launcher and the sidecar (which often run as root).

The hostile steps run as ``nobody`` (``setpriv``), in a sticky, world-writable fileroot like
``/tmp``: planting the run directory, symlinks to files only root may touch, forged rank records
naming other processes, and fake progress in another user's log directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from areal_watchdog.cli import main
from areal_watchdog.common.atomic import write_json_atomic
from areal_watchdog.config.model import WatchdogSection
from areal_watchdog.evidence.discovery import Scope, discover
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.watch.progress import default_log_patterns
from conftest import DEMO_CONFIG, FAST, Launcher, read_reports

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="needs root and util-linux's setpriv to act as a second user",
)
NOBODY = 65534


def as_nobody(*argv: str) -> None:
    """Run one command as the hostile user."""
    hostile = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    subprocess.run([*hostile, *argv], check=True, capture_output=True)


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A fileroot like /tmp: root's, world-writable and sticky."""
    root = Path(tempfile.mkdtemp(prefix="areal-shared-", dir="/tmp"))
    root.chmod(0o1777)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def root_secret(tmp_path: Path) -> Path:
    secret = tmp_path / "secret"
    secret.write_text("only root may read or write this\n")
    secret.chmod(0o600)
    return secret


def launch(capsys: pytest.CaptureFixture[str], root: Path, *extra: str) -> tuple[int, str]:
    code = main(["--watchdog", "local", str(DEMO_CONFIG), f"cluster.fileroot={root}", *extra])
    return code, capsys.readouterr().err


def test_a_planted_run_directory_with_a_symlink_is_refused_and_nothing_is_overwritten(
    capsys: pytest.CaptureFixture[str], shared_root: Path, root_secret: Path
) -> None:
    watch = shared_root / "hang-demo" / "t1" / "watchdog"
    as_nobody("mkdir", "-p", str(watch))
    as_nobody("ln", "-s", str(root_secret), str(watch / "launch_config.yaml"))
    code, err = launch(capsys, shared_root, "trial_name=t1")
    assert code == 2 and "owned by uid 65534" in err and "Traceback" not in err
    assert root_secret.read_text() == "only root may read or write this\n"


def test_a_planted_ranks_symlink_never_exposes_a_secret(
    capsys: pytest.CaptureFixture[str], shared_root: Path, root_secret: Path, tmp_path: Path
) -> None:
    trap = shared_root / "trap"
    as_nobody("mkdir", "-p", str(trap), str(shared_root / "hang-demo" / "t2" / "watchdog"))
    as_nobody("ln", "-s", str(root_secret), str(trap / "rank_0.stacks.txt"))
    as_nobody("ln", "-s", str(trap), str(shared_root / "hang-demo" / "t2" / "watchdog" / "ranks"))
    code, err = launch(capsys, shared_root, "trial_name=t2")
    assert code == 2 and "refusing" in err
    assert oct(root_secret.stat().st_mode & 0o777) == oct(0o600)


def test_our_run_directory_is_private(launcher: Launcher, shared_root: Path) -> None:
    result = launcher.run(
        [*FAST, f"cluster.fileroot={shared_root}", "demo.hang=none", "watchdog.stall_timeout=60"]
    )
    assert result.returncode == 0, result.output[-2000:]
    run_dir = shared_root / "hang-demo" / "t"
    assert run_dir.stat().st_mode & 0o777 == 0o700
    with pytest.raises(subprocess.CalledProcessError):
        as_nobody("touch", str(run_dir / "watchdog" / "ranks" / "rank_7.json"))
    logs = [p for p in (run_dir / "watchdog" / "logs").rglob("*.log") if p.is_file()]
    assert logs
    for path in logs:  # the rank logs hold whatever the job prints: no other user reads them
        with pytest.raises(subprocess.CalledProcessError):
            as_nobody("cat", str(path))
    ours = [run_dir / "watchdog" / "launch.json", run_dir / "watchdog" / "launch_config.yaml"]
    assert all(p.stat().st_mode & 0o077 == 0 for p in ours)


def test_a_forged_record_never_gets_another_process_signalled(tmp_path: Path) -> None:
    """Even inside our own run directory, a record naming a process that is not the job's
    (another user's, or ours without the rank wrapper) is ignored: nobody gets signal 9."""
    layout = RunLayout(tmp_path / "run")
    layout.ranks_dir.mkdir(parents=True)
    theirs = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sleep", "60"]
    )
    ours = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.2)
        for rank, victim in ((0, theirs), (1, ours), (7, ours)):
            started = psutil.Process(victim.pid).create_time()
            record = {"run_id": "r1", "rank": rank, "world_size": 2, "node": "n", "pid": victim.pid,
                      "started_at": started, "cooperative_signal": 9}  # fmt: skip
            write_json_atomic(layout.registration(rank), record)
        assert discover(layout, Scope("r1", "n", world_size=2), expected=2).ranks == {}
        assert theirs.poll() is None and ours.poll() is None
    finally:
        for proc in (theirs, ours):
            proc.send_signal(signal.SIGKILL)
            proc.wait()


def test_another_users_log_cannot_fake_progress(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path / "exp" / "trial")
    layout.run_dir.mkdir(parents=True)
    info = LaunchInfo("r1", "local", str(layout.run_dir), 1, ["n"], 1, "exp", "trial",
                      str(tmp_path), WatchdogSection())  # fmt: skip
    patterns = default_log_patterns(layout, info)
    assert str(tmp_path / "logs" / "root" / "exp" / "trial" / "*.log") in patterns
    assert not any("/logs/*/" in p for p in patterns)


def test_a_second_launch_into_a_running_directory_is_refused(
    launcher: Launcher, capsys: pytest.CaptureFixture[str]
) -> None:
    first, run_dir = launcher.start([*FAST, "demo.hang=none", "demo.steps=200"])
    deadline = time.monotonic() + 60
    while not (run_dir / "watchdog" / "launch.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)
    code = main(
        ["local", str(DEMO_CONFIG), f"cluster.fileroot={launcher.root}", "trial_name=t", *FAST]
    )
    err = capsys.readouterr().err
    assert code == 2 and f"already in use by areal-launch pid {first.pid}" in err, err
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=60)
    assert read_reports(run_dir) == []
    assert sys.executable  # the first launch went on untouched until we stopped it
