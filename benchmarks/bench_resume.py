"""``on_hang: resume`` against the cancel baseline: a torchrun script of a user's own, then a
real AReaL run of the CPU harness.

The torchrun script is ``examples/chat_rl`` (4 ranks on gloo, 8 groups a step, chat rows sharing
a system message) with one poisoned row at step 3: measured, report -> resumed (the report
written to the resumed run's first new step) and its parts, the replays and what they cost.

One single-controller GRPO run of 12 steps on two data-parallel ranks, recover checkpoint every
step, with two hangs: a data-dependent one (a dataset row the tiny model's own code loops on,
about global step 5) and a transient one (the second actor worker frozen once with SIGSTOP
while it trains global step 8). The launcher's terminal lines are timed as they arrive.

Reported: the wall time to finish all steps with ``on_hang: resume`` beside the time to the
first report (where ``on_hang: cancel`` would have ended the run), goodput (training time over
wall time), for each hang the time from the stall to training resumed and the replays it took,
and the restart beside the job's own start-up time (the issue's goal: within 2x).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import psutil

from benchmarks.bench_areal import cannot_run, make_harness

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "examples" / "areal" / "gsm8k_grpo.yaml"
STEPS = 12
POISONED_ROW = 10  # batch size 2: global step 5
FROZEN_STEP = 8
STEP_DONE = re.compile(r"(\d{8}-\d\d:\d\d:\d\d\.\d+) StatsLogger INFO: .*Train step (\d+)/\d+ done")

Rows = list[tuple[str, str, str]]


def run_benchmark(root: Path, freeze: bool = True) -> list[tuple[float, str]]:
    """The launcher's terminal lines, each with the time it arrived."""
    cmd = [
        "bash", str(REPO / "scripts" / "loopback.sh"), sys.executable, "-m", "areal_watchdog.cli",
        "--watchdog", "local", str(CONFIG), f"cluster.fileroot={root}", "trial_name=resume",
        f"total_train_steps={STEPS}", "actor.backend=fsdp:d2", "+actor.ppo_n_minibatches=2",
        "recover.mode=auto", "+recover.freq_steps=1", "watchdog.on_hang=resume",
        "+watchdog.resume.backoff=1", "watchdog.stall_timeout=12", "watchdog.poll_interval=0.5",
    ]  # fmt: skip
    if freeze:
        threading.Thread(target=_freeze_once, args=(root,), daemon=True).start()
    lines: list[tuple[float, str]] = []
    with subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        lines.append((time.time(), "[bench] started"))
        for line in proc.stdout:
            lines.append((time.time(), line.rstrip("\n")))
    lines.append((time.time(), f"[bench] exit {proc.returncode}"))
    return lines


def _freeze_once(root: Path) -> None:
    """SIGSTOP the second actor worker once, when the controller dumped ``FROZEN_STEP``."""
    dump = root / "gsm8k-grpo" / "resume" / "debug_trajectories" / f"step_{FROZEN_STEP:06d}.pt"
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline and not dump.exists():
        time.sleep(0.2)
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        args = " ".join(cmdline)
        worker = cmdline[1:3] == ["-m", "areal.infra.rpc.rpc_server"]  # not its bash -c wrapper
        if worker and "--role actor --worker-index 1 " in args and str(root) in args:
            os.kill(proc.pid, signal.SIGSTOP)
            return


def _first(lines: list[tuple[float, str]], text: str, after: float = 0.0) -> float | None:
    return next((t for t, line in lines if text in line and t >= after), None)


def _training_seconds(lines: list[tuple[float, str]]) -> float:
    """Time spent training: between consecutive steps done within one attempt."""
    total, previous = 0.0, None
    for _arrived, line in lines:
        if line.startswith("[areal-launch] run "):
            previous = None
        found = STEP_DONE.search(line)
        if found:
            stamp = datetime.strptime(found.group(1), "%Y%m%d-%H:%M:%S.%f").timestamp()
            total += stamp - previous if previous is not None else 0.0
            previous = stamp
    return total


def summarize(root: Path, lines: list[tuple[float, str]], healthy: float) -> Rows:
    """The table's rows from one run's lines and its reports (``healthy``: the wall time of
    the same run without its hangs)."""
    started, ended = lines[0][0], lines[-1][0]
    first_step = _first(lines, "first step seen")
    reports = sorted((root / "gsm8k-grpo" / "resume" / "incidents").glob("*/report.json"))
    wall = ended - started
    rows: Rows = [
        ("outcome", f"{lines[-1][1][8:]}; {_last_step(lines)}", "exit 0, all 12 steps"),
        ("wall time, on_hang: resume", f"{wall:.0f} s", "-"),
        ("the same run without its hangs", f"{healthy:.0f} s (x{wall / healthy:.2f})", "-"),
        ("job start-up (launch to first step)", f"{first_step - started:.0f} s", "-"),
    ]
    first_report = _first(lines, "[areal-launch] report:")
    if first_report is not None and reports:
        done = json.loads(reports[0].read_text()).get("last_step")
        rows.append(("cancel baseline: launch to first report",
                     f"{first_report - started:.0f} s, {done} steps done", "-"))  # fmt: skip
    training = _training_seconds(lines)
    rows.append(("goodput (training time / wall time)",
                 f"{training:.0f} s / {wall:.0f} s = {training / wall:.1%}", "-"))  # fmt: skip
    for path in reports:
        rows += _hang_rows(json.loads(path.read_text()), lines, first_step - started)
    return rows


def _hang_rows(report: dict, lines: list[tuple[float, str]], startup: float) -> Rows:
    """One hang: what it was, its replays, and the time to training resumed."""
    recovery = report.get("recovery") or {}
    stalled = datetime.fromisoformat(report["last_progress_at"]).timestamp()
    relaunched = recovery.get("relaunched_at")
    relaunch = datetime.fromisoformat(relaunched).timestamp() if relaunched else None
    resumed = _first(lines, "first step seen", after=relaunch) if relaunch else None
    replays = recovery.get("replays") or []
    skipped = len(recovery.get("rows_skipped") or [])
    name = f"hang at step {report.get('last_step')}: {report.get('category')}"
    rows = [(name, f"{recovery.get('decision')}: {recovery.get('replay') or '-'}"[:160], "-"),
            ("  replays (bisection included)",
             f"{len(replays)}, {sum(r['seconds'] for r in replays):.0f} s; {skipped} row(s) "
             "quarantined", "-")]  # fmt: skip
    if resumed is not None:
        restart = resumed - relaunch
        ratio = f"{restart:.0f} s / {startup:.0f} s = x{restart / startup:.2f}"
        rows += [("  stall to training resumed", f"{resumed - stalled:.0f} s", "-"),
                 ("  restart (relaunch to first step) / start-up", ratio, "<= x2")]  # fmt: skip
    return rows


def _last_step(lines: list[tuple[float, str]]) -> str:
    steps = [int(m.group(2)) for _t, line in lines if (m := STEP_DONE.search(line))]
    return f"last step done {max(steps)}" if steps else "no step done"


CHAT_CONFIG = REPO / "examples" / "chat_rl" / "config.yaml"


def chat_rows(root: Path) -> Rows:
    """One run of the chat example with a poisoned row at step 3, timed line by line."""
    cmd = [sys.executable, "-m", "areal_watchdog.cli", "--watchdog", "local", str(CHAT_CONFIG),
           f"cluster.fileroot={root}", "trial_name=bench", "data.poisoned=[21]"]  # fmt: skip
    lines: list[tuple[float, str]] = [(time.time(), "[bench] started")]
    with subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        lines += [(time.time(), line.rstrip("\n")) for line in proc.stdout]
    report = _first(lines, "[areal-launch] report:")
    relaunch = _first(lines, "[areal-launch] run ", after=report or 0.0)
    resumed = _first(lines, "first step seen", after=relaunch or 0.0)
    record = json.loads((root / "chat-rl" / "bench" / "watchdog" / "recovery.json").read_text())
    (hang,) = record["attempts"]
    replays = hang["replays"]
    hung = [r["seconds"] for r in replays if r["hung"]]
    spent = sum(r["seconds"] for r in replays)
    rows: Rows = [
        ("outcome", f"exit {proc.returncode}, {record['outcome']}", "completes by itself"),
        ("report -> resumed (first new step seen)", f"{resumed - report:.0f} s", "-"),
        ("  replays, bisection included", f"{len(replays)}, {spent:.0f} s; narrowed 8 groups "
         f"to {hang['narrowed']['to']}", "the poisoned row alone"),
        ("  a hung replay, start to report", f"{min(hung):.0f}-{max(hung):.0f} s",
         "stall 6 s + second look 3 s + start-up"),
        ("  relaunch -> first new step", f"{resumed - relaunch:.0f} s", "-"),
        ("rows the resumed run left out", str(hang["rows_left_out"]), "1 of 64"),
    ]  # fmt: skip
    return rows


def run_resume_benchmarks(quick: bool = False) -> Iterator[tuple[str, Rows]]:
    with tempfile.TemporaryDirectory(prefix="areal-bench-resume-chat-") as tmp:
        yield (
            "on_hang: resume on a torchrun script (examples/chat_rl: 4 ranks, 8 groups a step, "
            "a poisoned row at step 3, stall_timeout 6)",
            chat_rows(Path(tmp)),
        )
    title = (
        f"on_hang: resume on real AReaL (CPU harness, single controller, fsdp:d2, {STEPS} steps; "
        f"a poisoned row at step {POISONED_ROW // 2}, a rank frozen once at step {FROZEN_STEP})"
    )
    if cannot_run():
        yield title, [("skipped", cannot_run(), "-")]
        return
    with tempfile.TemporaryDirectory(prefix="areal-bench-resume-") as tmp:
        root = Path(tmp)
        make_harness(root / "clean" / "harness")
        clean = run_benchmark(root / "clean", freeze=False)
        make_harness(root / "harness", "--train-poison-from", str(POISONED_ROW),
                     "--train-poison-count", "1")  # fmt: skip
        lines = run_benchmark(root)
        yield title, summarize(root, lines, clean[-1][0] - clean[0][0])
