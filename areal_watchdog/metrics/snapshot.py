"""What one sidecar's metrics hold at one poll, as plain data: its node's, and (the leader's
only) the job's. Built by ``watch/parts/metrics_feed.py``; rendered by ``families``."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

STEP_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)  # seconds
POLL_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1)  # seconds
LOOK_OUTCOMES = ("dismissed", "written", "posted", "damage", "warning")


@dataclass
class Histogram:
    """Cumulative counts per upper bound, as Prometheus keeps them (+Inf is ``count``)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = self.counts or [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        for i in range(bisect.bisect_left(self.bounds, value), len(self.bounds)):
            self.counts[i] += 1
        self.total += value
        self.count += 1


@dataclass
class JobMetrics:
    """The job as the leader sees it: one set per job, whatever its size."""

    last_step: int | None = None
    last_step_at: float | None = None  # unix time of the last step line (or heartbeat)
    last_progress_at: float | None = None  # the silence counts from here (pauses included)
    threshold_s: float = 0.0
    hard_limit_s: float = 0.0
    step_intervals: Histogram = field(default_factory=lambda: Histogram(STEP_BUCKETS))
    looks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LOOK_OUTCOMES, 0))
    incidents: dict[str, int] = field(default_factory=dict)  # kind -> posted incidents
    deliveries: dict[tuple[str, str], int] = field(default_factory=dict)  # (sink, outcome)
    spool_depth: int = 0


@dataclass
class NodeMetrics:
    """One node's sidecar: a fixed set per node, no per-rank label."""

    leader: bool = False
    ranks_alive: int = 0
    ranks_gone: int = 0
    gpus: int = 0
    gpus_working: int = 0
    servers: int = 0
    servers_generating: int = 0
    poll_seconds: Histogram = field(default_factory=lambda: Histogram(POLL_BUCKETS))
    cpu_s: float = 0.0
    status_written_at: float | None = None


@dataclass
class MetricsSnapshot:
    """Everything one sidecar exposes; ``job`` only on the leader."""

    labels: dict[str, str]  # experiment, trial, backend, job_id, node
    node: NodeMetrics = field(default_factory=NodeMetrics)
    job: JobMetrics | None = None
    running: bool = True  # the job's ranks still run here
