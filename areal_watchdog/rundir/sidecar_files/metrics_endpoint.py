"""Where a sidecar serves its metrics: ``watchdog/metrics/<node>.json`` in the run directory,
written once its endpoint listens and removed when it stops. The file is also a Prometheus
``file_sd`` target file (a list of one target group); Prometheus takes wildcards only in a
pattern's last element, so a copy can go to one directory that every job shares
(``watchdog.metrics.file_sd_dir``), and one ``file_sd_configs`` entry then scrapes every
running job's sidecars and forgets each when its job ends (docs/monitoring.md). It carries the
run id as a label, like every record here (``rundir/run_id_check.py``)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from areal_watchdog.common.atomic import read_json, write_json_atomic
from areal_watchdog.rundir.layout import RunLayout

READABLE = 0o644  # Prometheus and node_exporter read these files as users of their own


def node_file_stem(run_id: str, node: str) -> str:
    """``areal_watchdog_<run id>_<node>``, safe as a file name: the name of one sidecar's files
    in a directory that every job shares (file_sd targets, node_exporter's textfiles)."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in f"{run_id}_{node}")
    return f"areal_watchdog_{safe}"


@dataclass(frozen=True)
class MetricsEndpoint:
    """One sidecar's endpoint and the labels Prometheus adds to what it scrapes there."""

    run_id: str
    node: str
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def to_file_sd(self) -> list[dict]:
        labels = {"run_id": self.run_id, "areal_watchdog_node": self.node}
        return [{"targets": [self.address], "labels": labels}]


def endpoint_files(layout: RunLayout, endpoint: MetricsEndpoint, shared: str | None) -> list[Path]:
    """The run directory's record, and its copy in the shared ``file_sd`` directory if any."""
    own = [layout.metrics_dir / f"{endpoint.node}.json"]
    if not shared:
        return own
    return [*own, Path(shared) / f"{node_file_stem(endpoint.run_id, endpoint.node)}.json"]


def write_endpoint(layout: RunLayout, endpoint: MetricsEndpoint, shared: str | None = None) -> None:
    layout.metrics_dir.mkdir(parents=True, exist_ok=True)
    for path in endpoint_files(layout, endpoint, shared):
        write_json_atomic(path, endpoint.to_file_sd(), mode=READABLE)


def remove_endpoint(
    layout: RunLayout, endpoint: MetricsEndpoint, shared: str | None = None
) -> None:
    for path in endpoint_files(layout, endpoint, shared):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def read_endpoints(layout: RunLayout, run_id: str) -> list[MetricsEndpoint]:
    """The endpoints of run ``run_id`` that are listening (their files exist)."""
    found = []
    for path in sorted(layout.metrics_dir.glob("*.json")):
        groups = read_json(path)
        if not isinstance(groups, list) or not groups or not isinstance(groups[0], dict):
            continue
        labels, targets = groups[0].get("labels") or {}, groups[0].get("targets") or []
        if labels.get("run_id") != run_id or not targets:
            continue
        host, _, port = str(targets[0]).rpartition(":")
        node = str(labels.get("areal_watchdog_node"))
        found.append(MetricsEndpoint(run_id, node, host, int(port)))
    return found
