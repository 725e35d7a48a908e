"""Every node's last status, as its sidecar published it (``status/<node>.json``): read by
``areal-launch status`` for any backend, written by ``watch/cluster/coordination.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import read_json
from areal_watchdog.rundir.layout import RunLayout


def node_statuses(run_dir: Path) -> list[dict[str, Any]]:
    """Every node's last published status, as the sidecars wrote it."""
    layout = RunLayout(run_dir)
    if not layout.status_dir.is_dir():
        return []
    statuses = [read_json(p) for p in sorted(layout.status_dir.glob("*.json"))]
    return [s for s in statuses if isinstance(s, dict)]
