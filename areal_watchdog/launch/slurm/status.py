"""What ``areal-launch status`` shows of a run directory: each node's last status and the
newest incidents, written defensively (a damaged or hand-edited file shows ``?``, never a
traceback)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import read_json
from areal_watchdog.common.rankset import format_ranks
from areal_watchdog.launch.slurm.jobs import node_statuses
from areal_watchdog.rundir.layout import RunLayout


def status_lines(run_dir: Path, now: float) -> list[str]:
    """One line per node, then one per recent incident (the newest three)."""
    lines = [_node_line(status, now) for status in node_statuses(run_dir)]
    reports = sorted(RunLayout(run_dir).incidents_dir.glob("*/report.json"))
    for path in reports[-3:]:
        report = read_json(path)
        report = report if isinstance(report, dict) else {}
        nodes = report.get("culprit_nodes")
        lines.append(
            f"  incident {report.get('incident_id')}: {report.get('category')}, culprit ranks "
            f"{_ranks(report.get('culprit_ranks'))}, nodes "
            f"{', '.join(map(str, nodes)) if isinstance(nodes, list) and nodes else '-'}"
        )
    return lines


def _node_line(status: dict[str, Any], now: float) -> str:
    leader = " (leader)" if status.get("leader") == status.get("node") else ""
    return (
        f"  {status.get('node')}{leader}: {status.get('state')}, last step "
        f"{status.get('last_step')}, ranks alive {_ranks(status.get('ranks_alive'))}, exited "
        f"{_ranks(status.get('ranks_gone'))}, seen {_age(status.get('time'), now)} ago, last "
        f"incident {status.get('last_incident') or '-'}"
    )


def _ranks(value: object) -> str:
    """Ranks as a range list (``0-3, 5``); ``-`` for none, ``?`` for anything not ranks."""
    if not isinstance(value, (list, dict)):
        return "-" if value is None else "?"
    try:
        return format_ranks(int(r) for r in _items(value)) or "-"
    except (TypeError, ValueError):
        return "?"


def _items(value: list[Any] | dict[str, Any]) -> Iterable[Any]:
    return value.keys() if isinstance(value, dict) else value


def _age(when: object, now: float) -> str:
    if isinstance(when, bool) or not isinstance(when, (int, float)):
        return "? s"
    return f"{now - float(when):.0f} s"
