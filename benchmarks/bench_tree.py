"""A rank is its whole process tree: the rows of the seconds benchmark that the process tree and
the kernel's word decide, on their own (``--only tree``), and what following the tree costs.

At the shipped defaults (``stall_timeout: auto``, ``on_hang: cancel``) on the 4-rank demo:
5 runs of each healthy job whose work is in a rank's children (rank 0's checkpoint copied by a
child process; every rank's DataLoader worker busy), 3 runs of a rank waiting forever on a child
that waits for an answer (at step 3, in the warm-up, and at step 10), and 3 runs of every rank
blocked on a FUSE filesystem whose server stops answering after step 4 (``testkit/fuse_storage.py``,
root and ``/dev/fuse``). Then the poll's cost at 8 ranks with 4 busy workers each.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from areal_watchdog.evidence.kernel_readings.counters import read_counters
from areal_watchdog.evidence.process_tree import TreeMeter
from benchmarks.bench_seconds import EARLY_STEP, HANG_STEP, _latency_row, _ms, run_one, tree_jobs
from testkit.fuse_storage import FuseStorage, available
from testkit.receiver import Receiver

Rows = list[tuple[str, ...]]
CALM, HANGS = 5, 3
FREEZE_STEP = 5  # the first step whose read the storage never answers


def run_tree_benchmarks(quick: bool = False) -> Iterator[tuple[str, Rows, tuple[str, ...]]]:
    receiver = Receiver("bench-secret")
    os.environ["BENCH_HOOK_URL"], os.environ["BENCH_HOOK_SECRET"] = receiver.url(), "bench-secret"
    calm, hangs = (1, 1) if quick else (CALM, HANGS)
    with tempfile.TemporaryDirectory(prefix="areal-bench-tree-") as tmp:
        root = Path(tmp)
        rows: Rows = []
        for step in (EARLY_STEP, HANG_STEP):
            hang = ["demo.hang=child_blocked", f"demo.hang_step={step}", "demo.hang_rank=2"]
            results = [run_one(root, receiver, f"child{step}x{i}", hang) for i in range(hangs)]
            rows.append(_row(f"child_blocked (step {step})", results, hangs))
        rows.append(_row("storage_stall (every rank, step 5)", storage(root, receiver, hangs),
                         hangs))  # fmt: skip
        yield (
            "Last step to posted report, shipped defaults (target: max <= 15 s, median <= 10 s)",
            rows,
            ("hang", "posted", "median s", "max s", "verdict (culprits)"),
        )
        quiet = []
        for name, overrides in tree_jobs().items():
            posts = [run_one(root, receiver, f"ok{len(quiet)}{i}", overrides) for i in range(calm)]
            quiet.append((name, f"{sum(p['posts'] for p in posts)} of {calm} runs", "0"))
        yield ("False positives at the shipped defaults (posted reports)", quiet,
               ("job", "posted", "target"))  # fmt: skip
    receiver.close()
    yield (
        "Following the process tree, per poll (8 ranks, 4 DataLoader-like workers each)",
        tree_cost(),
        ("read", "median ms", "max ms"),
    )


def _row(name: str, results: list[dict], runs: int) -> tuple[str, ...]:
    seconds = [r["seconds"] for r in results if r["seconds"] is not None]
    return _latency_row(name, seconds, runs, {f"{r['category']} {r['culprits']}" for r in results})


def storage(root: Path, receiver: Receiver, runs: int) -> list[dict]:
    """Every rank reads 1 MB of its shard on a FUSE mount at every step; the server answers no
    read from step ``FREEZE_STEP`` on."""
    if (why := available()) is not None:
        print(f"  storage_stall not run: {why}", flush=True)
        return []
    results = []
    for i in range(runs):
        mount = root / f"shards{i}"
        fs = FuseStorage(mount, ranks=4, size_mb=16, freeze_at_mb=FREEZE_STEP - 1)
        try:
            overrides = ["demo.hang=none", f"demo.shard_dir={mount}"]
            results.append(run_one(root, receiver, f"storage{i}", overrides))
        finally:
            fs.close()
    return results


def tree_cost(ranks: int = 8, workers: int = 4, polls: int = 100) -> Rows:
    """What a poll costs with the tree: each rank's own counters, then its descendants found
    and read (``TreeMeter.window``), against the counters alone."""
    spin = "import time\nwhile True: time.sleep(0.001)"
    script = (f"import subprocess, sys, time\nkids = [subprocess.Popen([sys.executable, '-c', "
              f"{spin!r}]) for _ in range({workers})]\ntime.sleep(600)")  # fmt: skip
    procs = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(ranks)]
    try:
        time.sleep(3)  # their workers started
        handles = [psutil.Process(p.pid) for p in procs]
        meters = [TreeMeter(p.pid) for p in procs]
        own, tree = [], []
        for _ in range(polls):
            started = time.perf_counter()
            for handle in handles:
                read_counters(handle, time.time())
            own.append(time.perf_counter() - started)
            started = time.perf_counter()
            for meter in meters:
                meter.window(time.time())
            tree.append(time.perf_counter() - started)
            time.sleep(0.01)
        found = statistics.median(len(m.pids()) for m in meters)
    finally:
        for proc in procs:
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
            proc.wait()
    return [
        (f"a poll: {ranks} ranks' own counters", *_ms(own)),
        (f"a poll: their descendants found and read ({found:g} a rank)", *_ms(tree)),
    ]


if __name__ == "__main__":
    sys.exit("run it through python -m benchmarks.run --only tree")
