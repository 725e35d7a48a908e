"""Notification benchmark: from report.json on disk to the webhook received, healthy receiver."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from areal_watchdog.common.redact import Redactor  # noqa: E402
from areal_watchdog.config.load import load_config  # noqa: E402
from areal_watchdog.config.sinks import parse_sinks  # noqa: E402
from areal_watchdog.notify.notifier import Notifier  # noqa: E402
from areal_watchdog.report.sample import sample_report  # noqa: E402
from receiver import Receiver  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
Rows = list[tuple[str, str, str]]


def run_notify_benchmarks(quick: bool = False) -> Iterator[tuple[str, Rows]]:
    receiver = Receiver("bench-secret")
    os.environ["BENCH_HOOK_URL"], os.environ["BENCH_HOOK_SECRET"] = receiver.url(), "bench-secret"
    specs = parse_sinks(
        [{"type": "webhook", "url_env": "BENCH_HOOK_URL", "secret_env": "BENCH_HOOK_SECRET"}],
        "bench",
    )
    config = load_config(REPO / "examples" / "hang_demo" / "config.yaml")
    delays = []
    with tempfile.TemporaryDirectory() as tmp:
        notifier = Notifier(specs, Path(tmp) / "spool", Redactor(), lambda _m: None)
        for _ in range(5 if quick else 20):
            report = sample_report(config)
            written = time.time()  # the sidecar submits right after report.json is on disk
            notifier.submit(report)
            count = len(receiver.requests)
            while len(receiver.requests) == count:
                time.sleep(0.0005)
            delays.append(receiver.requests[-1].wall - written)
        notifier.close(5)
    receiver.close()
    yield (
        "Notification latency (signed webhook, receiver on 127.0.0.1)",
        [
            (
                "report on disk -> webhook received, median",
                f"{statistics.median(delays) * 1000:.1f} ms",
                "seconds",
            ),
            ("report on disk -> webhook received, max", f"{max(delays) * 1000:.1f} ms", "-"),
        ],
    )
