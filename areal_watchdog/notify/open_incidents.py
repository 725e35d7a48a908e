"""Posted incidents still open at a sink that keeps incidents (PagerDuty), until they are
resolved: a hang when a step comes after it, anything when the job ends well. A resumed
attempt's sidecar finds the earlier attempts' open incidents in the run directory (the ledger
says which were resolved already)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import read_json
from areal_watchdog.notify.envelope import is_damage
from areal_watchdog.report.build import stamp

RESOLVED = "resolved"  # the follow-up's key: delivery_id(f"{incident}|resolved", sink)


@dataclass
class OpenIncidents:
    """The open incidents of one run, read from ``incidents_dir`` on first use."""

    incidents_dir: Path | None
    resolved: Callable[[list[str]], set[str]]  # which of these every resolving sink resolved
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    loaded: bool = False

    def posted(self, report: dict[str, Any]) -> None:
        self._load()
        self.reports[report["incident_id"]] = report

    def moved_after(self, progress_at: float | None) -> list[dict[str, Any]]:
        """The hangs, and the warnings of a silence (a livelock, a retry loop), that a step at
        ``progress_at`` ended (damage stays open until the end)."""
        if progress_at is None:
            return []
        self._load()
        over = [
            r for r in self.reports.values()
            if not is_damage(r) and (stamp(r.get("detected_at")) or progress_at) < progress_at
        ]  # fmt: skip
        return self._close(over)

    def all(self) -> list[dict[str, Any]]:
        """Every open incident (the job ended well)."""
        self._load()
        return self._close(list(self.reports.values()))

    def _close(self, reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for report in reports:
            self.reports.pop(report["incident_id"], None)
        return reports

    def _load(self) -> None:
        if self.loaded:
            return
        self.loaded = True
        if self.incidents_dir is None:
            return
        found: dict[str, dict[str, Any]] = {}
        for path in sorted(self.incidents_dir.glob("*/report.json")):
            if path.parent.is_symlink():
                continue  # a folder planted as a link is no incident of ours
            report = read_json(path)  # a report.json that is a link is not read
            incident = report.get("incident_id") if isinstance(report, dict) else None
            if isinstance(incident, str):
                found[incident] = report
        done = self.resolved(list(found))  # the ledger, read once
        for incident, report in found.items():
            if incident not in done:
                self.reports.setdefault(incident, report)
