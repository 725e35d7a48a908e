"""One command for every speed and memory target: ``.venv/bin/python -m benchmarks.run``.

Runs real jobs on this machine and prints one table per topic, each row beside its target.
``--only watchdog,notify`` limits the topics; ``--quick`` uses fewer repetitions.
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks.bench_areal import run_areal_benchmarks
from benchmarks.bench_cancel import run_cancel_benchmarks
from benchmarks.bench_diagnose import run_diagnose_benchmarks
from benchmarks.bench_faults import run_fault_benchmarks
from benchmarks.bench_metrics import run_metrics_benchmarks
from benchmarks.bench_netfs import run_netfs_benchmarks
from benchmarks.bench_notify import run_notify_benchmarks
from benchmarks.bench_resume import run_resume_benchmarks
from benchmarks.bench_scale import run_scale_benchmarks
from benchmarks.bench_seconds import run_seconds_benchmarks
from benchmarks.bench_sidecars import run_sidecar_benchmarks
from benchmarks.bench_trajectory import run_trajectory_benchmarks
from benchmarks.bench_tree import run_tree_benchmarks
from benchmarks.bench_watchdog import run_watchdog_benchmarks
from benchmarks.table import print_table

TOPICS = {
    "watchdog": run_watchdog_benchmarks,
    "seconds": run_seconds_benchmarks,
    "notify": run_notify_benchmarks,
    "trajectory": run_trajectory_benchmarks,
    "faults": run_fault_benchmarks,
    "diagnose": run_diagnose_benchmarks,
    "scale": run_scale_benchmarks,
    "sidecars": run_sidecar_benchmarks,
    "netfs": run_netfs_benchmarks,
    "areal": run_areal_benchmarks,
    "resume": run_resume_benchmarks,
    "metrics": run_metrics_benchmarks,
    "cancel": run_cancel_benchmarks,
    "tree": run_tree_benchmarks,
}


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--only", default=",".join(TOPICS), help="comma-separated topics")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    started = time.time()
    for name in args.only.split(","):
        if name not in TOPICS:
            parser.error(f"unknown topic {name!r}; choose from {', '.join(TOPICS)}")
        for title, rows, *header in TOPICS[name](quick=args.quick):
            print_table(title, rows, *header)
    print(f"\n(total {time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
