"""``areal-launch status`` on a running job answers "slow or hung?" with the job's own numbers:
one real 2-rank job, slow at one step (longer than any step before, within the threshold), then
hung (rank 1 frozen; ``on_hang: report`` leaves it running), asked at both moments."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAST
from testkit.launcher import Launcher

pytestmark = pytest.mark.slow


def status(run_dir: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "areal_watchdog.cli", "status", str(run_dir)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def wait_for_answer(run_dir: Path, start: str, timeout: float) -> str:
    """The status whose answer line begins with ``start``, asked every 0.5 s."""
    deadline, seen = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        if not (run_dir / "watchdog" / "launch.json").exists():  # not launched yet
            time.sleep(0.5)
            continue
        seen = status(run_dir)
        if any(line.startswith(start) for line in seen.splitlines()):
            return seen
        time.sleep(0.5)
    raise AssertionError(f"no {start!r} within {timeout} s; last status:\n{seen}")


def test_status_tells_a_slow_step_from_a_hung_one(launcher: Launcher) -> None:
    overrides = [
        *[o for o in FAST if "on_hang" not in o and "stall_timeout" not in o],
        "watchdog.stall_timeout=12", "watchdog.on_hang=report", "launch.nproc_per_node=2",
        "demo.steps=40", "demo.step_time=0.2", "demo.slow_step=8", "demo.slow_time=8",
        "demo.hang=collective_stuck", "demo.hang_step=12", "demo.hang_rank=1",
    ]  # fmt: skip
    proc, run_dir = launcher.start(overrides, trial="pace")
    try:
        slow = wait_for_answer(run_dir, "slow, not hung: step 8 in progress", 90)
        assert "longer than 99 % of steps" in slow and "the watchdog looks at 12 s" in slow
        assert "  threshold   12 s (configured or warming up)" in slow
        hung = wait_for_answer(run_dir, "looks hung: step 12 in progress", 90)
        assert "past the 12 s threshold" in hung
        assert "steps take" in hung and "incident " in hung
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
