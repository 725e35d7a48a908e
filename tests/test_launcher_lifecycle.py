"""The launcher's life and death, as a user meets them: nothing of the run outlives it, an
interrupt pages nobody, a dead sidecar is noticed and replaced, and after a cancel the last
words on the terminal are the verdict and where the report is."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAST, timeline_of
from testkit.launcher import Launcher, await_late_finishes, gone_within, processes_under
from testkit.receiver import Receiver
from testkit.reports import read_reports

pytestmark = pytest.mark.slow

HEALTHY_LONG = [*FAST, "launch.nproc_per_node=2", "demo.hang=none", "demo.steps=400"]


def wait_for(proc: subprocess.Popen, text: str, timeout: float = 60) -> str:
    """Read the launcher's output until ``text`` appears; return what was read."""
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen += line
        if text in line:
            return seen
    pytest.fail(f"{text!r} never appeared:\n{seen[-3000:]}")


def test_kill_9_of_the_launcher_leaves_no_process_of_the_run(launcher: Launcher) -> None:
    proc, _ = launcher.start(HEALTHY_LONG)
    wait_for(proc, "first step seen")
    os.killpg(proc.pid, 0)  # the launcher's session exists
    proc.kill()  # only the launcher: its children live in sessions of their own
    proc.wait()
    left = gone_within(launcher.root, 15)
    assert left == [], [p.cmdline() for p in left]


def test_what_a_job_that_failed_by_itself_left_running_is_ended(
    launcher: Launcher, tmp_path: Path
) -> None:
    """CI caught AReaL 2.0's controller failing to start a worker: it exited 1 and the workers
    it had forked (sessions of their own) lived on. A job that ends by itself, well or not,
    leaves no process of its run behind."""
    script = tmp_path / "train.py"
    script.write_text(
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', sys.argv[0]],\n"
        "                 start_new_session=True)\n"
        "sys.exit(1)\n"
    )  # fmt: skip
    config = tmp_path / "config.yaml"
    config.write_text(
        "experiment_name: leftovers\ntrial_name: t\ncluster: {fileroot: /tmp}\n"
        f"launch: {{entrypoint: {script}, nproc_per_node: 1}}\n"
        "watchdog: {stall_timeout: 30, startup_timeout: 60, poll_interval: 0.25}\n"
    )
    result = launcher.run([], config=config)
    assert result.returncode == 1, result.output[-3000:]
    left = gone_within(tmp_path, 10)
    assert left == [], [p.cmdline() for p in left]


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT])
def test_an_interrupt_ends_everything_and_pages_nobody(launcher: Launcher, sig: int) -> None:
    proc, run_dir = launcher.start(HEALTHY_LONG)
    wait_for(proc, "first step seen")
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output[-3000:]
    assert "interrupted: stopping the job" in output
    assert "Traceback" not in output and "SignalException" not in output  # one Ctrl-C: calm
    assert read_reports(run_dir) == [], "an interrupt by the user is not a failure"
    assert "report written" not in output
    assert gone_within(launcher.root, 10) == []


def test_a_second_interrupt_kills_at_once(launcher: Launcher) -> None:
    proc, _ = launcher.start(HEALTHY_LONG)
    wait_for(proc, "first step seen")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    started = time.monotonic()
    proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert time.monotonic() - started < 15
    assert gone_within(launcher.root, 10) == []


def test_a_killed_sidecar_is_replaced_and_the_hang_still_reported(launcher: Launcher) -> None:
    proc, run_dir = launcher.start(
        [*FAST, "launch.nproc_per_node=3", "demo.hang=collective_mismatch", "demo.hang_step=6"]
    )
    wait_for(proc, "first step seen")
    (sidecar,) = [
        p for p in processes_under(launcher.root) if "areal_watchdog.watch.sidecar" in p.cmdline()
    ]
    sidecar.kill()
    output, _ = proc.communicate(timeout=120)
    assert "the watchdog sidecar died (exit -9): restarting it (1/3)" in output
    assert proc.returncode == 3, output[-3000:]
    (report,) = read_reports(run_dir)
    assert report["category"] == "collective_mismatch" and report["culprit_ranks"] == [2]


def test_after_a_cancel_the_verdict_is_the_last_word(launcher: Launcher) -> None:
    result = launcher.run([*FAST, "launch.nproc_per_node=3", "demo.hang=collective_mismatch"])
    assert result.returncode == 3
    tail = result.output[result.output.index("the watchdog reported a hang") :]
    assert "Traceback" not in tail and "SignalException" not in tail
    last = result.output.strip().splitlines()[-2:]
    assert last[0].startswith("[areal-launch] job cancelled after a hang: collective_mismatch")
    assert last[1].startswith("[areal-launch] report: ") and last[1].endswith("report.md")


def test_a_job_whose_ranks_never_start_is_reported_at_the_startup_timeout(
    launcher: Launcher, tmp_path: Path
) -> None:
    """The job's python starts the sidecar but never torchrun (a launcher or container that
    hangs, as torchrun does at a rendezvous that a node never joins): no rank ever registers.
    At ``startup_timeout`` that silence is a hang like any other, reported and cancelled (the
    watchdog waited forever: nothing was alive that a silence could be blamed on)."""
    shim = tmp_path / "python"
    shim.write_text(
        "#!/bin/sh\n"
        "case \" $* \" in *' torch.distributed.run '*) exec sleep 600;; esac\n"
        f'exec {sys.executable} "$@"\n'
    )
    shim.chmod(0o755)
    overrides = [*FAST, "launch.nproc_per_node=2", f"+launch.python={shim}",
                 "watchdog.startup_timeout=4"]  # fmt: skip
    result = launcher.run(overrides, timeout=90)
    assert result.returncode == 3, result.output
    (report,) = result.reports
    assert report["category"] == "unknown" and report["culprit_ranks"] == [0, 1]
    assert report["summary"].startswith(
        "No rank started: ranks 0-1 never registered with the watchdog within the start-up timeout"
    ), report["summary"]
    assert gone_within(launcher.root, 10) == []


def test_a_slow_channel_never_holds_a_cancelled_job_its_late_finish_sends(
    launcher: Launcher,
) -> None:
    """The channel answers the report only after 60 s: the launcher returns anyway (the job is
    over), ``status`` says what the sidecar's late finish still sends, and the late finish
    delivers the report (the same webhook id) and draws the timeline, then leaves nothing."""
    receiver = Receiver()
    receiver.script = [(200, {}, 60.0)]
    hook = ["+watchdog.notify=[{type: webhook, url_env: TEST_LATE_HOOK, max_attempts: 1}]"]
    try:
        proc, run_dir = launcher.start(
            [
                *FAST,
                "launch.nproc_per_node=2",
                "demo.hang=straggler",
                "demo.hang_rank=1",
                "demo.hang_step=3",
                "demo.steps=6",
                *hook,
            ],
            env={"TEST_LATE_HOOK": receiver.url()},
        )
        output, _ = proc.communicate(timeout=150)
        assert proc.returncode == 3, output[-3000:]
        assert "job over; a late finish (pid" in output, output[-3000:]
        status = subprocess.run([sys.executable, "-m", "areal_watchdog.cli", "status",
                                 str(run_dir)], capture_output=True, text=True)  # fmt: skip
        assert f"late finish on {platform.node()}" in status.stdout, status.stdout
        await_late_finishes(run_dir)
        (report,) = read_reports(run_dir)
        ids = [r.headers.get("webhook-id") for r in receiver.requests]
        assert len(ids) == 2 and len(set(ids)) == 1, ids  # cut off at the exit, then sent again
        timeline_of(report)
        status = subprocess.run([sys.executable, "-m", "areal_watchdog.cli", "status",
                                 str(run_dir)], capture_output=True, text=True)  # fmt: skip
        assert "done: 1 notification(s) sent, 0 left in the spool" in status.stdout, status.stdout
    finally:
        receiver.close()
