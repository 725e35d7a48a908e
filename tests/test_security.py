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
from areal_watchdog.common.interprocess.fifo import write_fifo
from areal_watchdog.config.model import WatchdogSection
from areal_watchdog.config.sinks import parse_sinks
from areal_watchdog.evidence.discovery import Scope, discover
from areal_watchdog.notify.spool import Spool
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.watch.progress.step_log import default_log_patterns
from conftest import FAST
from testkit.launcher import DEMO_CONFIG, Launcher
from testkit.receiver import Receiver
from testkit.reports import read_reports

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
    layout.registrations("n").mkdir(parents=True)
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
            write_json_atomic(layout.registration(rank, "n"), record)
        assert discover(layout, Scope("r1", "n", world_size=2), expected=2).ranks == {}
        assert theirs.poll() is None and ours.poll() is None
    finally:
        for proc in (theirs, ours):
            proc.send_signal(signal.SIGKILL)
            proc.wait()


def test_a_planted_file_or_symlink_at_a_trigger_is_never_written(tmp_path: Path) -> None:
    """A rank's trigger is a FIFO it listens on: a regular file or a symlink in its place (to
    a file of ours) is left as it was, and a FIFO nobody reads is not waited on."""
    mine = tmp_path / "mine.txt"
    mine.write_text("keep")
    (tmp_path / "file").write_text("keep")
    (tmp_path / "link").symlink_to(mine)
    os.mkfifo(tmp_path / "unread")
    for name in ("file", "link", "unread", "absent"):
        assert not write_fifo(tmp_path / name, "dump 1")
    assert (tmp_path / "file").read_text() == mine.read_text() == "keep"


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


@pytest.fixture
def slurm_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``scancel``, ``scontrol`` and ``squeue`` that only write down how they were called."""
    shims, calls = tmp_path / "slurm-bin", tmp_path / "slurm-calls"
    shims.mkdir()
    for name in ("scancel", "scontrol", "squeue"):
        (shims / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n')
        (shims / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}:{os.environ['PATH']}")
    return calls


def planted_run(shared_root: Path) -> Path:
    """A run directory another user made: a job id that is an option, and a spool entry that
    would have us sign a message of theirs with our secret and send it to their URL."""
    run = shared_root / "exp" / "planted"
    theirs = {"type": "webhook", "url_env": "THEIR_URL", "secret_env": "OUR_WEBHOOK_SECRET"}
    spec = parse_sinks([theirs], "their.yaml")[0]
    Spool(RunLayout(run).spool_dir).keep("msg_planted", spec, b'{"text": "x"}', "ConnectionError")
    write_json_atomic(RunLayout(run).slurm_job_file, {"job_id": "--user=root"})
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(shared_root / "exp")], check=True)
    return run


@pytest.mark.parametrize("command", ["cancel", "status", "replay", "diagnose"])
def test_commands_refuse_a_run_directory_another_user_controls(
    capsys: pytest.CaptureFixture[str],
    shared_root: Path,
    slurm_calls: Path,
    tmp_path: Path,
    command: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    receiver = Receiver()
    monkeypatch.setenv("THEIR_URL", receiver.url())
    monkeypatch.setenv("OUR_WEBHOOK_SECRET", "whsec_b3VyIHNpZ25pbmcgc2VjcmV0")
    try:
        run = planted_run(shared_root)
        link = tmp_path / "mine"
        link.symlink_to(run)  # ours, pointing into theirs
        for target in (run, link):
            assert main([command, str(target)]) == 2
            (line,) = capsys.readouterr().err.splitlines()
            assert "owned by uid 65534" in line, line
    finally:
        receiver.close()
    assert not slurm_calls.exists(), slurm_calls.read_text()  # no scancel --user=root
    assert receiver.requests == []  # nothing signed and sent for them


@pytest.mark.parametrize("job_id", ["--user=root", ["1", "2"], "1 2", True, None, "12;id"])
def test_a_job_id_that_is_not_slurms_never_reaches_a_command_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, slurm_calls: Path, job_id: object
) -> None:
    run = tmp_path / "exp" / "t"
    RunLayout(run).watch_dir.mkdir(parents=True)
    write_json_atomic(RunLayout(run).slurm_job_file, {"job_id": job_id})
    for command in ("cancel", "status"):
        assert main([command, str(run)]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert "is not a Slurm job id" in line, line
    assert not slurm_calls.exists()


def test_status_shows_damaged_node_records_as_unknown(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, slurm_calls: Path
) -> None:
    layout = RunLayout(tmp_path / "exp" / "t")
    layout.status_dir.mkdir(parents=True)
    write_json_atomic(layout.slurm_job_file, {"job_id": "42"})
    write_json_atomic(layout.node_status("n1"), {"node": "n1", "ranks_alive": 5, "time": "x"})
    write_json_atomic(layout.node_status("n2"), {"node": "n2", "ranks_alive": {"a": 1}})
    assert main(["status", str(layout.run_dir)]) == 0
    out = capsys.readouterr().out
    assert "n1: None, last step None, ranks alive ?" in out and "seen ? s ago" in out
    assert "n2:" in out
    assert slurm_calls.read_text() == "scontrol show job -o 42\n"


@pytest.mark.parametrize("command", ["cancel", "status"])
def test_without_slurms_commands_cancel_and_status_say_so_in_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main([command, "123"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "cannot run it" in line and "Slurm's client commands must be on PATH" in line


@pytest.mark.slow
def test_another_users_step_lines_under_a_shared_fileroot_mask_no_hang(
    launcher: Launcher, shared_root: Path
) -> None:
    """``fileroot: /tmp``-like: another user writes "Train step 1007" lines where AReaL's logs
    of this trial go while the job hangs at step 4; the hang is still reported."""
    fake = shared_root / "logs" / "root" / "hang-demo" / "t"
    as_nobody("mkdir", "-p", str(fake))
    loop = 'i=1000; while :; do echo "Train step $i/2000 done."; i=$((i+1)); sleep 0.3; done'
    liar = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         "sh", "-c", f"{loop} >> {fake / 'trainer.log'}"]
    )  # fmt: skip
    try:
        result = launcher.run(
            [*FAST, f"cluster.fileroot={shared_root}", "launch.nproc_per_node=3",
             "demo.hang=collective_mismatch", "demo.hang_step=4"]
        )  # fmt: skip
    finally:
        liar.kill()
        liar.wait()
    assert result.returncode == 3, result.output[-3000:]
    assert f"step lines in {fake / 'trainer.log'} do not count: owned by uid 65534" in (
        result.output
    )
    (report,) = read_reports(shared_root / "hang-demo" / "t")
    assert report["category"] == "collective_mismatch" and report["culprit_ranks"] == [2]


EXTRA = "launch-env-only-0123456789"  # a launch.env value under a secret-looking name
HOOK_SECRET = "file-signing-secret-0123456789"  # a notify secret read from a file
LEAKY_SCRIPT = """
import os, sys
rank = os.environ["RANK"]
print(f"rank {rank}: launch.env says {os.environ['EXTRA_API_KEY']} and that is all", flush=True)
print(f"rank {rank}: hook secret", open(sys.argv[1]).read().strip(), "end of line", file=sys.stderr)
print(f"rank {rank}: posting to {os.environ['LEAK_HOOK_URL']} soon")
"""


@pytest.mark.slow
def test_secrets_the_job_prints_are_masked_in_every_log_it_leaves(
    launcher: Launcher, tmp_path: Path
) -> None:
    """A job prints a launch.env secret and both notify secrets (the hook's URL from a variable
    whose name looks harmless, its signing secret from a file), on stdout and stderr: no file
    of the run holds them, nor the terminal; the lines are there, each value as ``***``."""
    script, secret = tmp_path / "leak.py", tmp_path / "hook_secret"
    script.write_text(LEAKY_SCRIPT)
    secret.write_text(HOOK_SECRET)
    secret.chmod(0o600)
    config = tmp_path / "leak.yaml"
    config.write_text(
        "experiment_name: leak\ntrial_name: t\ncluster: {n_nodes: 1, n_gpus_per_node: 0, "
        f"fileroot: {tmp_path}}}\n"
        f"launch: {{entrypoint: {script}, nproc_per_node: 2, args: [{secret}], config_arg: null}}\n"
        "watchdog: {enabled: true, stall_timeout: 60, notify: [{type: webhook, "
        f"url_env: LEAK_HOOK_URL, secret_file: {secret}}}]}}\n"
    )
    receiver = Receiver()
    try:
        hook = receiver.url("/hook")
        result = launcher.run(
            [f"+launch.env.EXTRA_API_KEY={EXTRA}"], config=config, env={"LEAK_HOOK_URL": hook}
        )
    finally:
        receiver.close()
    assert result.returncode == 0, result.output[-3000:]
    files = [p for p in result.run_dir.rglob("*") if p.is_file() and not p.is_symlink()]
    texts = {p: p.read_text(errors="replace") for p in files}
    for path, text in [*texts.items(), (Path("terminal"), result.output)]:
        for value in (EXTRA, HOOK_SECRET, hook):
            assert value not in text, (path, value)
    (torchrun_log,) = (result.run_dir / "watchdog" / "logs").glob("torchrun_*.log")
    shown = texts[torchrun_log]  # local rank 0's lines, tee'd by torchrun, then by us
    assert "rank 0: launch.env says *** and that is all" in shown
    assert "rank 0: hook secret *** end of line" in shown
    for rank in (0, 1):  # torchrun's per-rank files, written from the rank's own streams
        stderr = next(t for p, t in texts.items() if p.match(f"*/{rank}/stderr.log"))
        stdout = next(t for p, t in texts.items() if p.match(f"*/{rank}/stdout.log"))
        assert f"rank {rank}: hook secret *** end of line" in stderr
        assert f"rank {rank}: posting to *** soon" in stdout
    assert "rank 0: launch.env says *** and that is all" in result.output


def test_check_workflow_refuses_an_out_folder_another_user_planted(
    capsys: pytest.CaptureFixture[str], shared_root: Path
) -> None:
    """The folder holds the request the probe acts on and the config the script reads: one
    another user made first is refused before anything starts."""
    planted = shared_root / "cw"
    as_nobody("mkdir", "-m", "0777", str(planted))
    config = Path(__file__).parents[1] / "examples" / "areal" / "gsm8k_grpo.yaml"
    code = main(["check-workflow", str(config), f"cluster.fileroot={shared_root}",
                 "--server", "127.0.0.1:9", "--out", str(planted)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and f"{planted}: owned by uid {NOBODY}, not by you" in err, err
    assert sorted(p.name for p in planted.iterdir()) == []


def test_a_recover_checkpoint_another_user_planted_is_never_unpickled(
    capsys: pytest.CaptureFixture[str], shared_root: Path, tmp_path: Path
) -> None:
    """A distributed checkpoint's ``.metadata`` is a pickle: one in a folder another user wrote
    is refused in one line, before torch reads it."""
    harness = Path(__file__).parents[1] / "examples" / "areal" / "harness"
    subprocess.run([sys.executable, str(harness / "make_tiny.py"), str(tmp_path / "h"), "--rows",
                    "8"], check=True, capture_output=True)  # fmt: skip
    made = subprocess.run([sys.executable, str(harness / "sampled_dump.py"),
                           str(tmp_path / "h" / "tiny-qwen2"), str(tmp_path / "root")],
                          check=True, capture_output=True, text=True)  # fmt: skip
    planted = shared_root / "recover_checkpoint"
    as_nobody("mkdir", str(planted))
    as_nobody("touch", str(planted / ".metadata"))  # what a forged pickle would sit in
    code = main(["check-consistency", made.stdout.strip(), "--weights", str(planted)])
    err = capsys.readouterr().err
    assert code == 2 and f"{planted}: owned by uid {NOBODY}, not by you or root" in err, err
    assert "run check-consistency as the user who launched the run" in err
