"""The sidecar's side of the metrics: a snapshot of what it already knows, taken at the end of
each poll, handed to the HTTP endpoint (rendered when Prometheus scrapes) and to node_exporter's
textfile (written by a thread of its own after each poll). Nothing here reads anything new: the
clock, the incident desk, the notifier and the node's watch already hold every value. Off
unless ``watchdog.metrics`` asks."""

from __future__ import annotations

from typing import Any

import psutil

from areal_watchdog.diagnose.kinds import CATEGORIES
from areal_watchdog.metrics.exposition import SnapshotCollector, registry_for, render
from areal_watchdog.metrics.http_endpoint import HttpEndpoint
from areal_watchdog.metrics.snapshot import JobMetrics, MetricsSnapshot, NodeMetrics
from areal_watchdog.metrics.textfile import TextfileWriter, textfile_path
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.sidecar_files.metrics_endpoint import (
    MetricsEndpoint,
    remove_endpoint,
    write_endpoint,
)
from areal_watchdog.watch.parts.shared import Collaborators
from areal_watchdog.watch.processes.node_watch import NodeWatch

KINDS = tuple(k.name for k in CATEGORIES)  # every kind at 0 from the start: increase() sees 0 -> 1


class MetricsFeed:
    """One sidecar's metrics and where they go; ``close`` takes them all back."""

    def __init__(self, info: LaunchInfo, node: str, log: Any) -> None:
        wanted = info.watchdog.metrics
        self.info, self.node, self.log = info, node, log
        self.collector = SnapshotCollector()
        self.registry = registry_for(self.collector)
        self.node_metrics = NodeMetrics()
        self.job = JobMetrics()
        self.intervals_seen = 0
        self.process = psutil.Process()
        self.endpoint: HttpEndpoint | None = None
        self.textfile: TextfileWriter | None = None
        if wanted.textfile_dir:
            path = textfile_path(wanted.textfile_dir, info.run_id, node)
            self.textfile = TextfileWriter(path, lambda: render(self.registry), log)
        if wanted.http:
            self.endpoint = HttpEndpoint(self.registry, wanted.host, wanted.port)
            self.record = MetricsEndpoint(info.run_id, node, wanted.host, self.endpoint.port)
            write_endpoint(info.layout, self.record, wanted.file_sd_dir)
            log(f"metrics served on http://{wanted.host}:{self.endpoint.port}/metrics")

    def labels(self, job_id: str | None) -> dict[str, str]:
        info = self.info
        job = job_id or info.run_id
        return {"experiment": info.experiment_name, "trial": info.trial_name,
                "backend": info.backend, "job_id": job, "node": self.node}  # fmt: skip

    def update(
        self, kit: Collaborators, status_written_at: float | None, poll_seconds: float,
        running: bool,
    ) -> None:  # fmt: skip
        """After a poll: refresh the snapshot from the sidecar's collaborators; the textfile's
        thread writes it."""
        node = self.node_metrics
        node.poll_seconds.observe(poll_seconds)
        cpu = self.process.cpu_times()
        node.cpu_s = cpu.user + cpu.system
        node.status_written_at = status_written_at
        _node_view(node, kit.watch)
        leading = kit.coordinator.is_leader()
        node.leader = leading
        if leading:
            self._job_view(kit)
        snapshot = MetricsSnapshot(self.labels(kit.job_id), node,
                                   self.job if leading else None, running)  # fmt: skip
        self.collector.update(snapshot)
        if self.textfile is not None:
            self.textfile.changed()

    def _job_view(self, kit: Collaborators) -> None:
        clock, incidents, notifier, job = kit.clock, kit.incidents, kit.notifier, self.job
        fresh = clock.intervals_seen - self.intervals_seen
        for interval in list(clock.intervals)[-fresh:] if fresh > 0 else ():
            job.step_intervals.observe(interval)
        self.intervals_seen = clock.intervals_seen
        job.last_step, job.last_step_at = clock.last_step, clock.last_step_at
        job.last_progress_at = clock.last_progress_at
        job.threshold_s, job.hard_limit_s = clock.threshold, incidents.escalation.cancel_after()
        job.looks.update(incidents.look_outcomes)
        job.incidents = {**dict.fromkeys(KINDS, 0), **incidents.posted_kinds}
        job.deliveries = dict(notifier.deliveries)
        job.spool_depth = notifier.spool_depth

    def close(self) -> None:
        """The job ended (or the sidecar stops): no endpoint, no file, no stale series."""
        if self.endpoint is not None:
            remove_endpoint(self.info.layout, self.record, self.info.watchdog.metrics.file_sd_dir)
            self.endpoint.close()
        if self.textfile is not None:
            self.textfile.close()


def _node_view(node: NodeMetrics, watch: NodeWatch) -> None:
    node.ranks_alive, node.ranks_gone = len(watch.live), len(watch.gone)
    node.gpus = len(watch.gpus.last)
    node.gpus_working = sum(watch.gpus.state(g) == "working" for g in watch.gpus.last)
    servers = watch.pulse.summary() or {}
    node.servers, node.servers_generating = servers.get("of", 0), servers.get("generating", 0)


def start_feed(info: LaunchInfo, node: str, log: Any) -> MetricsFeed | None:
    """The feed ``watchdog.metrics`` asks for, or None; a failure to start is said, not fatal."""
    wanted = info.watchdog.metrics
    if not wanted.http and not wanted.textfile_dir:
        return None
    try:
        return MetricsFeed(info, node, log)
    except Exception as exc:  # noqa: BLE001 - a watchdog without metrics still watches
        log(f"metrics unavailable ({type(exc).__name__}: {exc}); watching without them")
        return None
