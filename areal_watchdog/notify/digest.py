"""What every chat sink shows of a report, in the same words: the headline, the facts, the
stack groups that fit a budget (the rest folded into one line that points to the report)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from areal_watchdog.common.rankset import format_ranks, worker_label
from areal_watchdog.diagnose.kinds import title
from areal_watchdog.notify.envelope import encode

MAX_RANKS_CHARS = 240  # a rank list longer than this is cut with a count
MAX_WHERE_CHARS = 400
MAX_GROUPS_SHOWN = 15  # more than this is unreadable in a channel: fold the rest


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def ranks(values: list[int]) -> str:
    text = format_ranks(values)
    if len(text) <= MAX_RANKS_CHARS:
        return text
    return f"{text[:MAX_RANKS_CHARS].rsplit(',', 1)[0]}, \u2026 ({len(values)} ranks)"


def job_name(report: dict[str, Any]) -> str:
    job = report["job"]
    return f"{job.get('experiment_name') or '?'}/{job.get('trial_name') or '?'}"


def headline(report: dict[str, Any]) -> str:
    """``Ranks called different collectives: collective_mismatch in exp/trial``: the kind's
    title (``Warning: `` first for damage), its name, the job."""
    return f"{title(report)}: {report['category']} in {job_name(report)}"


def facts(report: dict[str, Any]) -> list[tuple[str, str]]:
    """Culprits (ranks, nodes, workers), step, time stuck, size, confidence, cause."""
    stalled = report.get("stalled_for_s")
    found = [
        ("Culprit ranks", ranks(report["culprit_ranks"]) or "none named"),
        ("Culprit nodes", ", ".join(report["culprit_nodes"]) or "-"),
        ("Last step", str(report["last_step"])),
        ("Stuck for", f"{stalled:.0f} s" if isinstance(stalled, (int, float)) else "-"),
        ("World size", str(report["job"]["world_size"])),
        ("Confidence", str(report["confidence"])),
    ]
    if report.get("cause"):
        found.append(("Cause", report["cause"]))
    workers = [worker_label(w) for w in report.get("culprit_workers") or []]
    if workers:
        found.append(("Culprit workers", clip("; ".join(workers), MAX_WHERE_CHARS)))
    return found


def culprits(report: dict[str, Any]) -> str:
    """``culprit ranks 3 on node1`` in one line."""
    nodes = ", ".join(report["culprit_nodes"])
    named = ranks(report["culprit_ranks"]) or "none named"
    return f"culprit ranks {named}" + (f" on {nodes}" if nodes else "")


def report_path(report: dict[str, Any]) -> str:
    return str(report["files"]["incident_dir"])


def replay_command(report: dict[str, Any]) -> str | None:
    return (report.get("trajectory") or {}).get("replay_command")


def group_lines(report: dict[str, Any], shown: int) -> list[str]:
    """The first ``shown`` stack groups as ``ranks: where``, then one line for the rest."""
    groups = report["groups"]
    lines = [f"{ranks(g['ranks'])}: {clip(g['where'], MAX_WHERE_CHARS)}" for g in groups[:shown]]
    hidden = groups[shown:]
    if hidden:
        lines.append(f"{fold_line(hidden)}, {report_path(report)}")
    return lines


def fold_line(hidden: list[dict[str, Any]]) -> str:
    """``... and 25 more stack groups (984 ranks): see the full report``."""
    count = sum(len(g["ranks"]) for g in hidden)
    return f"\u2026 and {len(hidden)} more stack groups ({count} ranks): see the full report"


def fit(
    build: Callable[[dict[str, Any], int], dict[str, Any]], report: dict[str, Any], limit: int
) -> dict[str, Any]:
    """``build(report, shown)`` with as many stack groups shown as keep its JSON within
    ``limit`` bytes."""
    shown = min(len(report["groups"]), MAX_GROUPS_SHOWN)
    while shown > 0 and size(build(report, shown)) > limit:
        shown -= 1
    return build(report, shown)


def size(message: dict[str, Any]) -> int:
    """Bytes of the message as sent."""
    return len(encode(message))


def recovery_line(report: dict[str, Any], recovery: dict[str, Any]) -> str:
    """What ``on_hang: resume`` decided, naming the incident."""
    verb = "resumed" if recovery["decision"] == "resume" else "not resumed"
    return (
        f"[areal-watchdog] {job_name(report)} {verb} after incident {report['incident_id']}: "
        f"{recovery['reason']}"
    )
