"""Watchdog benchmarks: detection latency, gathering, classification, sidecar cost, overhead."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import psutil

from areal_watchdog.diagnose.classify import classify
from areal_watchdog.evidence.model import BLOCKED, Evidence, Frame, RankEvidence, ThreadStack
from testkit.launcher import Launcher

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "hang_demo" / "config.yaml"
STEP_STAMP = re.compile(r"\(AReaL\) (\d{8}-\d\d:\d\d:\d\d\.\d{3}) .*Train step (\d+)/")

Rows = list[tuple[str, str, str]]


def launch(
    root: Path, trial: str, overrides: list[str], watchdog: bool = True, watch_sidecar: bool = False
) -> tuple[str, dict[str, float]]:
    """Run the demo to its end; optionally sample the sidecar's CPU and memory meanwhile."""
    args = ("--watchdog",) if watchdog else ()
    proc, _ = Launcher(root).start(overrides, trial=trial, config=DEMO, args=args)
    usage: dict[str, float] = {}
    if watch_sidecar:
        usage = _sample_sidecar(proc, root)
    output, _ = proc.communicate(timeout=600)
    return output, usage


def _sample_sidecar(launcher: subprocess.Popen, root: Path) -> dict[str, float]:
    sidecar = None
    while sidecar is None and launcher.poll() is None:
        for child in psutil.Process(launcher.pid).children():
            if "areal_watchdog.watch.sidecar" in " ".join(child.cmdline()):
                sidecar = child
        time.sleep(0.1)
    if sidecar is None:
        return {}
    time.sleep(5)  # past its start-up imports
    first_cpu, first_wall, peak_rss = sum(sidecar.cpu_times()[:2]), time.time(), 0
    last_cpu, last_wall = first_cpu, first_wall
    while launcher.poll() is None:
        try:
            last_cpu, last_wall = sum(sidecar.cpu_times()[:2]), time.time()
            peak_rss = max(peak_rss, sidecar.memory_info().rss)
        except psutil.Error:
            break
        time.sleep(0.5)
    return {
        "cpu_fraction": (last_cpu - first_cpu) / max(1e-9, last_wall - first_wall),
        "rss_mb": peak_rss / 2**20,
        "window_s": last_wall - first_wall,
    }


def step_interval(output: str) -> float:
    """Mean seconds between rank 0's step lines, skipping the first two steps (warm-up)."""
    stamps = [
        datetime.strptime(m.group(1), "%Y%m%d-%H:%M:%S.%f").timestamp()
        for m in STEP_STAMP.finditer(output)
    ]
    gaps = [b - a for a, b in zip(stamps[2:], stamps[3:], strict=False)]
    return statistics.mean(gaps)


def detection(root: Path, world: int) -> dict[str, float]:
    """Latency from the threshold crossing to report.json on disk, and the gathering time."""
    trial = f"det{world}"
    launch(
        root,
        trial,
        [
            "watchdog.stall_timeout=3",
            "watchdog.startup_timeout=60",
            "watchdog.poll_interval=1",
            f"launch.nproc_per_node={world}",
            "demo.hang=collective_mismatch",
            "demo.hang_step=3",
            f"demo.hang_rank={world - 1}",
            "demo.step_time=0.1",
        ],
    )
    (path,) = (root / "hang-demo" / trial).glob("incidents/*/report.json")
    report = json.loads(path.read_text())
    crossed = (
        datetime.fromisoformat(report["last_progress_at"]).timestamp() + report["stall_threshold_s"]
    )
    return {
        "latency": path.stat().st_mtime - crossed,
        "gather": report["timings"]["gather_s"],
        "flight_recorder": report["timings"]["flight_recorder_s"],
        "category_ok": float(report["culprit_ranks"] == [world - 1]),
    }


def synthetic(n: int) -> Evidence:
    torch_file = "/v/site-packages/torch/distributed/distributed_c10d.py"

    def threads(op: str, line: int) -> list[ThreadStack]:
        return [
            ThreadStack(
                "MainThread",
                [
                    Frame(op, torch_file, 1),
                    Frame("step", "/p/t.py", line),
                    Frame("main", "/p/t.py", 9),
                    Frame("<module>", "/p/t.py", 1),
                ],
            )
        ]

    ranks = [
        RankEvidence(r, f"n{r // 8}", r, r % 8, BLOCKED, "py-spy", threads("all_reduce", 5))
        for r in range(n)
    ]
    ranks[n // 3] = RankEvidence(n // 3, "x", 1, 0, BLOCKED, "py-spy", threads("broadcast", 7))
    return Evidence(world_size=n, ranks=ranks)


def classify_seconds(n: int, repeat: int) -> float:
    evidence = synthetic(n)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        verdict = classify(evidence)
        best = min(best, time.perf_counter() - start)
    assert verdict.culprit_ranks == [n // 3]
    return best


def run_watchdog_benchmarks(quick: bool = False) -> Iterator[tuple[str, Rows]]:
    with tempfile.TemporaryDirectory(prefix="areal-bench-") as tmp:
        root = Path(tmp)
        rows: Rows = []
        gather_rows: Rows = []
        fr_rows: Rows = []
        for world in (2, 4, 8):
            result = detection(root, world)
            rows.append(
                (f"detection latency, {world} ranks", f"{result['latency']:.2f} s", "<= 2 s")
            )
            fr_rows.append(
                (
                    f"Flight Recorder collection, {world} ranks",
                    f"{result['flight_recorder'] * 1000:.0f} ms",
                    "-",
                )
            )
            gather_rows.append(
                (
                    f"evidence gathering, {world} ranks",
                    f"{result['gather']:.3f} s",
                    "< 1 s for 8 ranks",
                )
            )
        yield "Hang detection (report on disk minus threshold crossing; poll 1 s)", rows
        yield "Evidence gathering (py-spy in parallel, then the Flight Recorder)", gather_rows
        yield "Extra time the Flight Recorder adds to gathering", fr_rows

        repeat = 3 if quick else 5
        yield (
            "Classification (synthetic ranks, one outlier)",
            [
                (
                    f"classify {n:,} ranks",
                    f"{classify_seconds(n, repeat) * 1000:.0f} ms",
                    "< 2 s for 10,000",
                )
                for n in (1_000, 10_000)
            ],
        )

        steps = "60" if quick else "120"
        _, usage = launch(
            root,
            "healthy",
            [
                "launch.nproc_per_node=4",
                "demo.hang=none",
                f"demo.steps={steps}",
                "demo.step_time=0.25",
                "watchdog.stall_timeout=30",
            ],
            watch_sidecar=True,
        )
        yield (
            "Sidecar cost while a healthy 4-rank job runs (poll 1 s)",
            [
                (
                    "sidecar CPU",
                    f"{usage['cpu_fraction'] * 100:.2f} % of a core over {usage['window_s']:.0f} s",
                    "< 1 %",
                ),
                ("sidecar peak RSS", f"{usage['rss_mb']:.0f} MB", "-"),
            ],
        )

        with_wd, without = [], []
        for i in range(1 if quick else 2):
            common = [
                "launch.nproc_per_node=2",
                "demo.hang=none",
                "demo.steps=60",
                "demo.step_time=0.05",
                "watchdog.stall_timeout=30",
            ]
            out, _ = launch(root, f"with{i}", common, watchdog=True)
            with_wd.append(step_interval(out))
            out, _ = launch(root, f"without{i}", common, watchdog=False)
            without.append(step_interval(out))
        ratio = statistics.mean(with_wd) / statistics.mean(without)
        yield (
            "Training overhead (2 ranks, 60 steps, side by side)",
            [
                ("step time with watchdog", f"{statistics.mean(with_wd) * 1000:.1f} ms", "-"),
                ("step time without", f"{statistics.mean(without) * 1000:.1f} ms", "-"),
                ("ratio with / without", f"{ratio:.3f}", "<= 1.02"),
            ],
        )
