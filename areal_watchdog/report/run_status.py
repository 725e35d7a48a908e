"""What ``areal-launch status`` shows of a run directory: each node's last status and the
newest incidents, written defensively (a damaged or hand-edited file shows ``?``, never a
traceback)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import read_json
from areal_watchdog.common.rankset import format_ranks
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.progress.pace import Pace, answer
from areal_watchdog.rundir.sidecar_files.late_finish import LateFinish
from areal_watchdog.rundir.sidecar_files.node_status import node_statuses


def status_lines(run_dir: Path, now: float) -> list[str]:
    """One line per node, one per late finish (what a sidecar still draws or sends after the
    job's end), then one per recent report (the newest four, incidents and the
    suspected looks nobody was paged for, by time)."""
    statuses = node_statuses(run_dir)
    lines = [*_pace_lines(statuses, now), *(_node_line(status, now) for status in statuses)]
    layout = RunLayout(run_dir)
    lines += [late.line(now) for late in LateFinish.read_all(layout)]
    reports = [
        *layout.incidents_dir.glob("*/report.json"),
        *layout.suspected_dir.glob("*/report.json"),
    ]
    for path in sorted(reports, key=lambda p: p.parent.name)[-4:]:
        report = read_json(path)
        report = report if isinstance(report, dict) else {}
        nodes = report.get("culprit_nodes")
        lines.append(
            f"  incident {report.get('incident_id')}: {report.get('category')}, culprit ranks "
            f"{_ranks(report.get('culprit_ranks'))}, nodes "
            f"{', '.join(map(str, nodes)) if isinstance(nodes, list) and nodes else '-'}"
            f"{_decided(report.get('confirmation'))}{_picture(path.parent)}"
        )
    return lines


def _picture(folder: Path) -> str:
    """Where the incident's timeline is, once drawn."""
    drawn = [folder / name for name in ("timeline.png", "timeline.svg") if (folder / name).exists()]
    return f"; timeline {drawn[0]}" if drawn else ""


def _decided(confirmation: object) -> str:
    """How a look was decided, when it was not simply reported: a suspected look is on disk
    only (nobody was paged for it)."""
    if not isinstance(confirmation, dict):
        return ""
    if confirmation.get("confirmed") is False:
        why = "; ".join(map(str, confirmation.get("moved") or [])) or "only time tells"
        return f" (suspected, not confirmed: {why}; not posted)"
    by = {"second_look": "a second look", "hard_limit": "the hard limit",
          "evidence": "conclusive evidence"}.get(str(confirmation.get("by")))  # fmt: skip
    return f" (confirmed by {by})" if by else ""


def _pace_lines(statuses: list[dict[str, Any]], now: float) -> list[str]:
    """ "Slow or hung?" in one line, then its numbers, from the leader's status (while the job
    runs: an ended job has its answer in its exit and reports)."""
    leader = next((s for s in statuses if s.get("leader") == s.get("node")), None)
    pace = Pace.from_dict(leader.get("pace")) if leader else None
    if pace is None or leader.get("state") != "watching":
        return []
    line, rows = answer(pace, now)
    servers = _servers(statuses)
    if servers:
        line += f"; {servers[0]} of {servers[1]} inference servers generating"
        rows.append(
            ("servers", f"{servers[0]} of {servers[1]} generating, {servers[2]:g} tokens/s")
        )
    width = max(len(name) for name, _ in rows)
    return [line, *(f"  {name.ljust(width)}  {value}" for name, value in rows)]


def _servers(statuses: list[dict[str, Any]]) -> tuple[int, int, float] | None:
    """The inference servers over every node: generating, found, tokens/s (their sidecars'
    probes, ``watch/processes/server_pulse.py``); None when no node found one. A damaged or forged
    entry counts for nothing, never a traceback."""
    generating = found = 0
    rate = 0.0
    for status in statuses:
        entry = status.get("servers")
        try:
            numbers = (int(entry["generating"]), int(entry["of"]), float(entry["tokens_per_s"]))
        except (KeyError, TypeError, ValueError):
            continue
        generating, found, rate = generating + numbers[0], found + numbers[1], rate + numbers[2]
    return (generating, found, round(rate, 1)) if found else None


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
