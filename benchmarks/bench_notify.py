"""Notification benchmark: from report.json on disk to the webhook received, healthy receiver;
and each vendor's sink against its loopback stand-in: the message's size for a small and a
1,024-rank report (the vendor's limit beside it) and the time to one accepted delivery."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from areal_watchdog.common.secrets.redact import Redactor
from areal_watchdog.config.load import load_config
from areal_watchdog.config.sinks import parse_sinks
from areal_watchdog.notify.notifier import Notifier, render
from areal_watchdog.notify.sinks.registry import parse
from areal_watchdog.report.sample import sample_report
from testkit.receiver import Receiver
from testkit.standins import start_all, vendor_sinks
from testkit.synthetic import synthetic_report

LIMITS = {"feishu": "20 KiB", "dingtalk": "20,000 B", "pagerduty": "512 KiB", "teams": "28 KiB"}

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
    yield "Vendor sinks against their loopback stand-ins", _vendor_rows()


def _vendor_rows() -> Rows:
    """Sizes as sent (JSON, before the per-attempt signature), and one delivery's time."""
    standins = start_all()
    items, env = vendor_sinks(standins)
    os.environ.update(env)
    small = sample_report(load_config(REPO / "examples" / "hang_demo" / "config.yaml"))
    big = synthetic_report(1024, 40, name="\u5c42" * 400)  # 6 bytes a character, escaped
    rows: Rows = []
    try:
        for spec in parse(items, "bench"):
            sizes = [len(render(spec, report)) for report in (small, big)]
            with tempfile.TemporaryDirectory() as tmp:
                notifier = Notifier([spec], Path(tmp) / "spool", Redactor(), lambda _m: None)
                started = time.time()
                notifier.submit(small)
                notifier.close(30)
            standin = standins[spec.type]
            took = standin.seen[0].at - started if standin.accepted else float("nan")
            rows.append((f"{spec.type}: bytes (sample; 1,024 ranks, 40 groups)",
                         f"{sizes[0]:,}; {sizes[1]:,}", f"under {LIMITS[spec.type]}"))  # fmt: skip
            rows.append((f"{spec.type}: report submitted -> accepted", f"{took * 1000:.1f} ms",
                         "seconds"))  # fmt: skip
    finally:
        for standin in standins.values():
            standin.close()
    return rows
