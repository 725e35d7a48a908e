"""Our families through ``prometheus_client`` (an optional extra: ``pip install
'areal-watchdog[metrics]'``): a collector that renders the newest snapshot at each scrape, so
that the silence is counted to the moment Prometheus asks, and the text format it writes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from areal_watchdog.metrics.families import JOB_LABELS, Family, families
from areal_watchdog.metrics.snapshot import Histogram, MetricsSnapshot

INSTALL = "pip install 'areal-watchdog[metrics]' (prometheus_client)"


def client_missing() -> str | None:
    """Why metrics cannot be exposed here (None: they can)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return f"watchdog.metrics needs prometheus_client: {INSTALL}"
    return None


class SnapshotCollector:
    """A ``prometheus_client`` collector over the newest snapshot (swapped whole each poll)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshot: MetricsSnapshot | None = None

    def update(self, snapshot: MetricsSnapshot) -> None:
        with self._lock:
            self._snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        with self._lock:
            snap = self._snapshot
        if snap is None:
            return
        values = [snap.labels.get(name, "") for name in JOB_LABELS]
        for family in families(snap, time.time()):
            yield _client_family(family, values)


def registry_for(collector: SnapshotCollector) -> Any:
    """A registry of our collector alone (no process or platform metrics of the client)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def render(registry: Any) -> bytes:
    """The text format Prometheus and node_exporter read."""
    from prometheus_client import generate_latest

    return generate_latest(registry)


def _client_family(family: Family, base: list[str]) -> Any:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    extra = list(family.samples[0][0]) if family.samples else []
    names = [*JOB_LABELS, *extra]
    if family.kind == "histogram":
        out = HistogramMetricFamily(family.name, family.help, labels=names)
        for labels, hist in family.samples:
            assert isinstance(hist, Histogram)
            buckets = [(_le(b), c) for b, c in zip(hist.bounds, hist.counts, strict=True)]
            out.add_metric([*base, *labels.values()], [*buckets, ("+Inf", hist.count)],
                           hist.total)  # fmt: skip
        return out
    kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
    out = kind(family.name, family.help, labels=names)
    for labels, value in family.samples:
        out.add_metric([*base, *labels.values()], float(value))  # type: ignore[arg-type]
    return out


def _le(bound: float) -> str:
    return f"{bound:g}" if bound != int(bound) else f"{bound:.1f}"
