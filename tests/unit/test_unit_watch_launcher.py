"""How a sidecar learns that it must stop or take over: the launcher's heartbeat on a Ray node
(``watch.parts.launcher_heartbeat``) and a standby sidecar's wait for its node's lock
(``watch.cluster.standby``)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from areal_watchdog.common.atomic import write_json_atomic
from areal_watchdog.config.model import WatchdogSection
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.watch.cluster import standby
from areal_watchdog.watch.parts import launcher_heartbeat
from areal_watchdog.watch.parts.launcher_heartbeat import LAUNCHER_SILENCE_S, watch_heartbeat
from areal_watchdog.watch.parts.shared import JobView

REPO = Path(__file__).resolve().parents[2]


class FakeSidecar:
    """What the heartbeat's watch reads and changes: the sidecar's view, its lines."""

    def __init__(self) -> None:
        self.view = JobView()
        self.lines: list[str] = []


def info(run_dir: Path) -> LaunchInfo:
    return LaunchInfo(
        run_id="r1", backend="ray", run_dir=str(run_dir), world_size=1, nodes=["n1"],
        nproc_per_node=1, experiment_name="e", trial_name="t", fileroot=str(run_dir),
        watchdog=WatchdogSection(),
    )  # fmt: skip


@pytest.fixture
def fast_watch(monkeypatch: pytest.MonkeyPatch):
    """The heartbeat thread's second between looks made short; the threads it starts, ended."""
    real_sleep = time.sleep
    monkeypatch.setattr(
        launcher_heartbeat,
        "time",
        SimpleNamespace(time=time.time, sleep=lambda _s: real_sleep(0.01)),
    )
    before = set(threading.enumerate())
    sidecars: list[FakeSidecar] = []
    yield sidecars
    for sidecar in sidecars:
        sidecar.view.done = True
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=1.0)
        assert not thread.is_alive()


def launcher_said(run_dir: Path, **record: object) -> None:
    write_json_atomic(RunLayout(run_dir).launcher_file, {"run_id": "r1", **record})


@pytest.mark.parametrize(
    "record",
    [
        {"time": time.time() - LAUNCHER_SILENCE_S - 5},  # an old heartbeat
        {"time": time.time(), "ended": True},  # it said it ended while the job runs
    ],
)
def test_a_launcher_gone_stops_the_sidecar_as_orphaned(
    tmp_path: Path, fast_watch: list[FakeSidecar], record: dict
) -> None:
    (tmp_path / "watchdog").mkdir()
    launcher_said(tmp_path, **record)
    sidecar, orphan = FakeSidecar(), threading.Event()
    fast_watch.append(sidecar)
    watch_heartbeat(info(tmp_path), sidecar.view, sidecar.lines.append, orphan)
    assert orphan.wait(1.0)
    assert sidecar.view.stopping
    assert sidecar.lines == ["areal-launch stopped answering (its heartbeat is old)"]


def test_no_heartbeat_yet_or_a_fresh_one_is_no_death(
    tmp_path: Path, fast_watch: list[FakeSidecar]
) -> None:
    (tmp_path / "watchdog").mkdir()
    sidecar, orphan = FakeSidecar(), threading.Event()
    fast_watch.append(sidecar)
    watch_heartbeat(info(tmp_path), sidecar.view, sidecar.lines.append, orphan)
    time.sleep(0.05)  # several looks: no file
    write_json_atomic(RunLayout(tmp_path).launcher_file, {"run_id": "old", "time": 0.0})
    time.sleep(0.05)  # another run's record is no news either
    launcher_said(tmp_path, time=time.time())
    assert not orphan.wait(0.1)
    assert not sidecar.view.stopping and sidecar.lines == []


STANDBY = """
import sys
from pathlib import Path
from areal_watchdog.rundir.layout import RunLayout
from {module} import wait_for_node_lock
print("waiting", flush=True)
print(wait_for_node_lock(RunLayout(Path(sys.argv[1])), "n1"), flush=True)
"""


def start_standby(run_dir: Path) -> subprocess.Popen:
    """A standby sidecar's wait, in a process of its own (it ends with its parent, and holds
    the lock until it ends)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    script = STANDBY.format(module=standby.__name__)
    return subprocess.Popen(
        [sys.executable, "-c", script, str(run_dir)], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def test_a_standby_takes_over_when_the_watching_sidecar_s_lock_is_released(
    tmp_path: Path,
) -> None:
    locks = RunLayout(tmp_path).watch_dir / "sidecars"
    locks.mkdir(parents=True)
    fd = os.open(locks / "n1.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the sidecar that watches this node
    held = True
    proc = start_standby(tmp_path)
    try:
        assert proc.stdout.readline() == "waiting\n"
        time.sleep(0.2)
        assert proc.poll() is None  # it waits while the lock is held
        os.close(fd)  # the watching sidecar's task ended
        held = False
        out, _ = proc.communicate(timeout=5)
        assert out == "True\n" and proc.returncode == 0
    finally:
        proc.kill()
        proc.wait()
        if held:
            os.close(fd)


def test_a_standby_that_cannot_have_a_lock_says_why_and_watches_nothing(tmp_path: Path) -> None:
    (tmp_path / "watchdog").write_text("a file where the folder should be")
    proc = start_standby(tmp_path)
    try:
        out, err = proc.communicate(timeout=5)
    finally:
        proc.kill()
        proc.wait()
    assert out == "waiting\nFalse\n"
    assert err.startswith("[areal-watchdog n1] no sidecar lock: ")
