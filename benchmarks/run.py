"""One command for every speed and memory target: ``.venv/bin/python benchmarks/run.py``.

Runs real jobs on this machine and prints one table per topic, each row beside its target.
``--only watchdog,notify`` limits the topics; ``--quick`` uses fewer repetitions.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_areal import run_areal_benchmarks  # noqa: E402
from bench_cancel import run_cancel_benchmarks  # noqa: E402
from bench_diagnose import run_diagnose_benchmarks  # noqa: E402
from bench_faults import run_fault_benchmarks  # noqa: E402
from bench_metrics import run_metrics_benchmarks  # noqa: E402
from bench_netfs import run_netfs_benchmarks  # noqa: E402
from bench_notify import run_notify_benchmarks  # noqa: E402
from bench_resume import run_resume_benchmarks  # noqa: E402
from bench_scale import run_scale_benchmarks  # noqa: E402
from bench_seconds import run_seconds_benchmarks  # noqa: E402
from bench_sidecars import run_sidecar_benchmarks  # noqa: E402
from bench_trajectory import run_trajectory_benchmarks  # noqa: E402
from bench_tree import run_tree_benchmarks  # noqa: E402
from bench_watchdog import run_watchdog_benchmarks  # noqa: E402

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


def print_table(
    title: str,
    rows: list[tuple[str, ...]],
    header: tuple[str, ...] = ("measure", "measured", "target"),
) -> None:
    """Print rows (``(measure, value, target)`` unless another header is given) under a title."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(f"\n## {title}\n")
    for cells in (header, tuple("-" * w for w in widths), *rows):
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
