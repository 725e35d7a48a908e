"""A run's incidents read back by the launcher: which report a run (or a replay) just wrote."""

from __future__ import annotations

from typing import Any

from areal_watchdog.common.atomic import mtime, read_json
from areal_watchdog.rundir.layout import RunLayout


def newest_report(layout: RunLayout, since: float) -> tuple[str | None, dict[str, Any] | None]:
    """The id and contents of the newest report written since ``since`` (None, None when no
    report reached the disk; the contents None when it cannot be read)."""
    reports = [p for p in layout.incidents_dir.glob("*/report.json") if mtime(p) >= since]
    if not reports:
        return None, None
    newest = max(reports, key=mtime)
    report = read_json(newest)
    return newest.parent.name, report if isinstance(report, dict) else None
