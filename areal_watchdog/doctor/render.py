"""The doctor's one table: a row per check (per status on a job's nodes, the nodes named), and
under each warning or failure its one-line fix."""

from __future__ import annotations

from areal_watchdog.doctor.model import FAIL, PASS, WARN, Check, NodeReport

MAX_NAMED = 6


def merge(reports: list[NodeReport]) -> list[tuple[Check, list[str]]]:
    """Each check once per status seen on the nodes, failures first, with the nodes that saw
    it; the detail is that of the first such node."""
    order: list[str] = []
    by_name: dict[str, list[tuple[Check, str]]] = {}
    for report in reports:
        for check in report.checks:
            if check.name not in by_name:
                order.append(check.name)
            by_name.setdefault(check.name, []).append((check, report.node))
    rows = []
    for name in order:
        for status in (FAIL, WARN, PASS):
            seen = [(c, node) for c, node in by_name[name] if c.status == status]
            if seen:
                rows.append((seen[0][0], [node for _, node in seen]))
    return rows


def nodes_label(nodes: list[str], total: int) -> str:
    if len(nodes) == total and total > 1:
        return f"all {total}"
    shown = ",".join(nodes[:MAX_NAMED])
    return shown + (f",+{len(nodes) - MAX_NAMED}" if len(nodes) > MAX_NAMED else "")


def render(rows: list[tuple[Check, list[str]]], total_nodes: int, title: str) -> str:
    """The table, then a one-line summary."""
    multi = total_nodes > 1
    labels = [nodes_label(nodes, total_nodes) if multi else "" for _, nodes in rows]
    width = max([len("check"), *(len(c.name) for c, _ in rows)])
    nwidth = max([len("nodes"), *map(len, labels)]) if multi else 0
    head = f"{'status':<6}  {'check':<{width}}  " + (f"{'nodes':<{nwidth}}  " if multi else "")
    indent = " " * len(head)
    lines = [title, "", head + "detail"]
    for (check, _), label in zip(rows, labels, strict=True):
        where = f"{label:<{nwidth}}  " if multi else ""
        lines.append(f"{check.status:<6}  {check.name:<{width}}  {where}{check.detail}")
        if check.status != PASS and check.fix:
            lines.append(f"{indent}fix: {check.fix}")
    counts = {s: sum(c.status == s for c, _ in rows) for s in (PASS, WARN, FAIL)}
    lines += ["", f"{counts[PASS]} pass, {counts[WARN]} warn, {counts[FAIL]} fail"]
    return "\n".join(lines)
