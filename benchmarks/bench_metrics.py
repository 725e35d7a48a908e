"""Metrics benchmark: what ``watchdog.metrics`` adds to one sidecar poll (the snapshot of a
sidecar watching 8 ranks and 8 GPUs; target 1 ms), what the node_exporter textfile costs its
own thread after each poll and a Prometheus scrape the endpoint's thread, and the series a
1,024-node job makes (one leader, 1,023 followers; target: bounded, no per-rank series)."""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from areal_watchdog.config.model import MetricsSection, WatchdogSection
from areal_watchdog.metrics.exposition import render
from areal_watchdog.metrics.textfile import write_textfile
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.watch.parts.metrics_feed import MetricsFeed
from areal_watchdog.watch.progress.stall_clock import StallClock
from benchmarks.table import print_table

NODES = 1024
POLL_GAP = 0.01  # seconds between two measured updates (a sidecar's: 1 s)
Rows = list[tuple[str, str, str]]


def run_metrics_benchmarks(quick: bool = False) -> Iterator[tuple[str, Rows]]:
    polls = 300 if quick else 1000
    with tempfile.TemporaryDirectory(prefix="areal-bench-metrics-") as tmp:
        poll_ms, scrape_ms = poll_cost(Path(tmp), polls)
        write_ms = textfile_cost(Path(tmp), polls)
        node_series, job_series = series(Path(tmp))
    total = node_series * NODES + job_series
    yield (
        "Metrics: cost per sidecar poll and series at 1,024 nodes",
        [
            ("in the poll: the snapshot (median)", f"{statistics.median(poll_ms):.3f} ms",
             "<= 1 ms"),
            ("in the poll: the snapshot (p99)", f"{_p99(poll_ms):.3f} ms", "<= 1 ms"),
            ("in the textfile's thread: render + atomic write (median)",
             f"{statistics.median(write_ms):.3f} ms", "-"),
            ("in the endpoint's thread: one HTTP scrape (median)",
             f"{statistics.median(scrape_ms):.3f} ms", "-"),
            ("series per node (any ranks per node)", str(node_series), "fixed"),
            ("series of the job (the leader's, one sink)", str(job_series), "fixed"),
            (f"series of a {NODES:,}-node job", f"{total:,}", "bounded"),
        ],
    )  # fmt: skip


def feed(folder: Path, http: bool, textfile: bool) -> MetricsFeed:
    metrics = MetricsSection(http=http, textfile_dir=str(folder) if textfile else None)
    info = LaunchInfo("bench", "local", str(folder / "run"), 8, ["n0"], 8, "exp", "trial",
                      str(folder), replace(WatchdogSection(), metrics=metrics))  # fmt: skip
    return MetricsFeed(info, "n0", lambda _m: None)


def sidecar_state(leader: bool) -> SimpleNamespace:
    """A sidecar's collaborators as the feed reads them: 8 ranks, 8 GPUs (6 working), steps so
    far."""
    clock = StallClock(None, 1800.0)
    for step in range(1, 300):
        clock.step(step, 1000.0 + step * 0.5)
    gpus = SimpleNamespace(last=list(range(8)), state=lambda g: "working" if g < 6 else "idle")
    return SimpleNamespace(
        clock=clock, job_id=None,
        coordinator=SimpleNamespace(is_leader=lambda: leader),
        incidents=SimpleNamespace(look_outcomes=Counter(dismissed=2),
                                  posted_kinds=Counter(straggler=1),
                                  escalation=SimpleNamespace(cancel_after=lambda: 600.0)),
        notifier=SimpleNamespace(deliveries=Counter({("hook", "delivered"): 1}), spool_depth=0),
        watch=SimpleNamespace(live=dict.fromkeys(range(8)), gone=set(), gpus=gpus,
                              pulse=SimpleNamespace(summary=lambda: {"of": 1, "generating": 1})),
    )  # fmt: skip


def poll_cost(folder: Path, polls: int) -> tuple[list[float], list[float]]:
    """The leader's feed with both ways on: ms per update, and ms per scrape of the endpoint.
    Updates are paced as a sidecar's polls are (seconds apart, here ``POLL_GAP``), so that the
    textfile's thread has written before the next one: back to back, its render holds the GIL
    in the middle of the next update, which no sidecar sees."""
    metrics = feed(folder, http=True, textfile=True)
    state = sidecar_state(leader=True)
    took = []
    for i in range(polls):
        state.clock.step(400 + i, 2000.0 + i)
        started = time.perf_counter()
        metrics.update(state, time.time(), 0.001, running=True)
        took.append((time.perf_counter() - started) * 1000)
        time.sleep(POLL_GAP)
    url = f"http://127.0.0.1:{metrics.endpoint.port}/metrics"
    scrapes = []
    for _ in range(min(polls, 200)):
        started = time.perf_counter()
        urllib.request.urlopen(url, timeout=5).read()
        scrapes.append((time.perf_counter() - started) * 1000)
    metrics.close()
    return took, scrapes


def textfile_cost(folder: Path, writes: int) -> list[float]:
    """What the textfile's thread does after each poll: render, then replace the file."""
    metrics = feed(folder, http=False, textfile=True)
    metrics.update(sidecar_state(leader=True), time.time(), 0.001, running=True)
    took = []
    for _ in range(writes):
        started = time.perf_counter()
        write_textfile(metrics.textfile.path, render(metrics.registry))
        took.append((time.perf_counter() - started) * 1000)
    metrics.close()
    return took


def series(folder: Path) -> tuple[int, int]:
    """Series of a follower's node, and those the leader adds for the job, counted in the text
    Prometheus would scrape."""
    counts = []
    for leader in (False, True):
        metrics = feed(folder, http=False, textfile=True)
        metrics.update(sidecar_state(leader), time.time(), 0.001, running=True)
        text = render(metrics.registry).decode()
        counts.append(sum(len(f.samples) for f in text_string_to_metric_families(text)))
        metrics.close()
    return counts[0], counts[1] - counts[0]


def _p99(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.99) - 1]


if __name__ == "__main__":
    for title, rows in run_metrics_benchmarks(quick="--quick" in sys.argv):
        print_table(title, rows)
