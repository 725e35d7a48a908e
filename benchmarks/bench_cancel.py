"""A cancelled job ends in seconds: from the last rank's end to ``areal-launch``'s return, over
real cancelled runs beside two busy loops (the suite's load on 2 cores), with a webhook that
answers each post only after 20 s (a slow channel), so that neither the notification nor the
timeline's drawing may hold the launcher. What the sidecar had not finished goes on in its late
finish: how long after the launcher's return the picture and the report arrived is shown too.

Each run is the demo's straggler (2 gloo ranks, hang at step 3, ``on_hang: cancel``, a 3 s
stall threshold). The last rank's end is read by polling the rank processes every 20 ms.
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.sidecar_files.late_finish import LateFinish
from testkit.launcher import Launcher
from testkit.receiver import Receiver

Rows = list[tuple[str, str, str]]
TITLE = "A cancelled job ends in seconds (beside two busy loops, a 20 s channel)"
SLOW_ANSWER_S = 20.0  # the channel's answer to each post
RUNS, QUICK_RUNS = 20, 5
TARGET_S = 10.0  # the launcher's return after the last rank's end, at the p99
RUN = [
    "watchdog.stall_timeout=3",
    "watchdog.startup_timeout=90",
    "watchdog.poll_interval=0.25",
    "watchdog.on_hang=cancel",
    "demo.step_time=0.1",
    "demo.hang=straggler",
    "demo.hang_rank=1",
    "demo.hang_step=3",
    "demo.steps=6",
    "launch.nproc_per_node=2",
    "+watchdog.notify=[{type: webhook, url_env: BENCH_HOOK_URL}]",
]


def run_cancel_benchmarks(quick: bool = False) -> list[tuple[str, Rows]]:
    """Time ``RUNS`` cancelled runs beside two busy loops; one row per measure."""
    receiver = Receiver()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    ends: list[float] = []
    late: list[float] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-cancel-") as tmp:
            for i in range(QUICK_RUNS if quick else RUNS):
                receiver.script = [
                    (200, {}, SLOW_ANSWER_S)
                ]  # the first post; a resend is answered at once
                end, finished = _one_run(Path(tmp), f"c{i}", receiver)
                ends.append(end)
                late.append(finished)
                print(f"  run {i}: launcher returned {end:.2f} s after the last rank's end; "
                      f"late finish done {finished:.1f} s after that", flush=True)  # fmt: skip
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
        receiver.close()
    p99 = _percentile(ends, 0.99)
    return [(TITLE, [
        ("runs (cancelled, beside 2 busy loops)", str(len(ends)), f"{RUNS}"),
        ("last rank's end -> launcher returns, median", f"{statistics.median(ends):.2f} s", ""),
        ("last rank's end -> launcher returns, p99", f"{p99:.2f} s", f"<= {TARGET_S:g} s"),
        ("last rank's end -> launcher returns, max", f"{max(ends):.2f} s", ""),
        ("launcher's return -> late finish done, max", f"{max(late):.1f} s",
         f"{SLOW_ANSWER_S:g} s channel + drawing"),
    ])]  # fmt: skip


def _one_run(root: Path, trial: str, receiver: Receiver) -> tuple[float, float]:
    """(seconds from the last rank's end to the launcher's return, seconds from that return to
    the end of the sidecar's late finish: 0 when it left none)."""
    env = {"BENCH_HOOK_URL": receiver.url("/hook")}
    runner = Launcher(root)
    proc, run_dir = runner.start(RUN, trial=trial, env=env)
    ranks: dict[int, psutil.Process] = {}
    last_end = None
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(proc.pid).children(recursive=True):
                if "train.py" in " ".join(child.cmdline()):
                    ranks.setdefault(child.pid, child)
        alive = [p for p in ranks.values() if p.is_running() and p.status() != "zombie"]
        if ranks and not alive and last_end is None:
            last_end = time.monotonic()
        time.sleep(0.02)
    returned = time.monotonic()
    proc.communicate()
    finished = _await_late_finish(RunLayout(run_dir), returned)
    runner.cleanup()
    if last_end is None:
        raise RuntimeError(f"{trial}: no rank was seen ending before the launcher returned")
    return returned - last_end, finished


def _await_late_finish(layout: RunLayout, since: float, timeout: float = 180.0) -> float:
    """Wait for the late finishes the sidecars left; seconds from ``since`` to their end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(f.running() for f in LateFinish.read_all(layout)):
        time.sleep(0.2)
    return max(0.0, time.monotonic() - since) if LateFinish.read_all(layout) else 0.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
