"""The metrics' names, types, units and help, in Prometheus' conventions (base units,
``_seconds``, ``_total`` for counters, ``_timestamp_seconds`` for moments), as plain families
that the exposition hands to ``prometheus_client``. Pure: a snapshot and a time in, families
out."""

from __future__ import annotations

from dataclasses import dataclass, field

from areal_watchdog.metrics.snapshot import Histogram, JobMetrics, MetricsSnapshot, NodeMetrics

PREFIX = "areal_watchdog_"
JOB_LABELS = ("experiment", "trial", "backend", "job_id", "node")


@dataclass
class Family:
    """One metric: ``kind`` gauge, counter or histogram; each sample's extra labels."""

    name: str
    kind: str
    help: str
    samples: list[tuple[dict[str, str], float | Histogram]] = field(default_factory=list)


def families(snap: MetricsSnapshot, now: float) -> list[Family]:
    """Every family the snapshot holds, the job's only when it has them (the leader)."""
    found = node_families(snap.node, snap.running)
    if snap.job is not None:
        found += job_families(snap.job, now)
    return found


def node_families(node: NodeMetrics, running: bool) -> list[Family]:
    def gauge(name: str, help_: str, value: float) -> Family:
        return Family(PREFIX + name, "gauge", help_, [({}, value)])

    found = [
        gauge("job_running", "1 while the job's processes run on this node", float(running)),
        gauge("leader", "1 on the node whose sidecar decides for the job", float(node.leader)),
        gauge("ranks_alive", "the job's ranks running on this node", node.ranks_alive),
        gauge("ranks_gone", "the job's ranks on this node that ended", node.ranks_gone),
        gauge("gpus", "the job's GPUs on this node", node.gpus),
        gauge("gpus_working", "the job's GPUs at work at the last sample", node.gpus_working),
        gauge("inference_servers", "inference servers found on this node", node.servers),
        gauge(
            "inference_servers_generating",
            "inference servers whose token counter moved",
            node.servers_generating,
        ),  # fmt: skip
        Family(
            PREFIX + "poll_duration_seconds",
            "histogram",
            "how long one sidecar poll took",
            [({}, node.poll_seconds)],
        ),  # fmt: skip
        Family(
            PREFIX + "cpu_seconds_total",
            "counter",
            "the sidecar's own CPU time",
            [({}, node.cpu_s)],
        ),  # fmt: skip
    ]
    if node.status_written_at is not None:
        help_ = "when the sidecar last wrote its node status"
        found.append(gauge("status_written_timestamp_seconds", help_, node.status_written_at))
    return found


def job_families(job: JobMetrics, now: float) -> list[Family]:
    def gauge(name: str, help_: str, value: float | None) -> list[Family]:
        return [] if value is None else [Family(PREFIX + name, "gauge", help_, [({}, value)])]

    silence = None if job.last_progress_at is None else max(0.0, now - job.last_progress_at)
    return [
        *gauge("last_step", "the job's last training step", job.last_step),
        *gauge("last_step_timestamp_seconds", "when the last step was seen", job.last_step_at),
        *gauge(
            "silence_seconds", "seconds without progress (a step, a heartbeat, a pause)", silence
        ),  # fmt: skip
        *gauge(
            "threshold_seconds", "the silence that opens a look, in force now", job.threshold_s
        ),  # fmt: skip
        *gauge(
            "hard_limit_seconds",
            "the silence that ends the job whatever moved (watchdog.cancel_after)",
            job.hard_limit_s,
        ),  # fmt: skip
        Family(
            PREFIX + "step_interval_seconds",
            "histogram",
            "seconds between two steps",
            [({}, job.step_intervals)],
        ),  # fmt: skip
        Family(
            PREFIX + "looks_total",
            "counter",
            "looks at a silence, by outcome: dismissed "
            "(something moved), written (a slow phase), posted, damage (a warning that lasts), "
            "warning (a possible livelock, a retry loop)",
            [({"outcome": k}, v) for k, v in sorted(job.looks.items())],
        ),  # fmt: skip
        Family(
            PREFIX + "incidents_total",
            "counter",
            "incidents posted, by kind",
            [({"kind": k}, v) for k, v in sorted(job.incidents.items())],
        ),  # fmt: skip
        Family(
            PREFIX + "deliveries_total",
            "counter",
            "notifications by sink and outcome (delivered, spooled, refused)",
            _deliveries(job),
        ),  # fmt: skip
        *gauge("spool_depth", "notifications waiting in the spool for a retry", job.spool_depth),
    ]


def _deliveries(job: JobMetrics) -> list[tuple[dict[str, str], float | Histogram]]:
    return [({"sink": s, "outcome": o}, v) for (s, o), v in sorted(job.deliveries.items())]


def series_count(found: list[Family]) -> int:
    """The time series these families make (a histogram: a bucket per bound, +Inf, sum, count)."""
    return sum(
        len(v.bounds) + 3 if isinstance(v, Histogram) else 1
        for family in found
        for _, v in family.samples
    )
