"""A verdict for a terminal (``areal-launch diagnose``): a few lines for people, or one JSON
object for scripts. Pure."""

from __future__ import annotations

from typing import Any

from areal_watchdog.common.rankset import culprits_phrase, format_ranks, ranks_phrase
from areal_watchdog.diagnose.verdict import Verdict


def verdict_dict(verdict: Verdict, source: dict[str, Any]) -> dict[str, Any]:
    """The ``--json`` object: the verdict's fields, the stack groups, the collective record."""
    return {
        "category": verdict.category,
        "culprit_ranks": verdict.culprit_ranks,
        "summary": verdict.summary,
        "confidence": round(verdict.confidence, 2),
        "culprit_nodes": verdict.culprit_nodes,
        "cause": verdict.cause,
        "culprit_workers": verdict.culprit_workers,
        "groups": [
            {"ranks": g.ranks, "kind": g.kind, "where": g.where, "signature": g.signature}
            for g in verdict.groups
        ],
        "collectives": verdict.collectives,
        "source": source,
    }


def verdict_text(verdict: Verdict) -> str:
    """What a person reads first: category, culprits, summary, then the evidence tables."""
    culprits = culprits_phrase(verdict.culprit_ranks, verdict.culprit_workers)
    cause = f" ({verdict.cause})" if verdict.cause else ""
    lines = [
        f"{verdict.category}{cause}: {culprits}, confidence {verdict.confidence:.2f}",
        verdict.summary,
    ]
    if verdict.groups:
        lines.append("stack groups:")
        lines += [f"  {ranks_phrase(g.ranks)}: {g.kind}, {g.where}" for g in verdict.groups]
    if verdict.collectives:
        lines.append("collective record:")
        lines += [
            "  " * (depth + 1) + line for depth, line in collective_lines(verdict.collectives)
        ]
    return "\n".join(lines)


def collective_lines(record: dict[str, Any]) -> list[tuple[int, str]]:
    """The collective record for people, as (depth, line): the terminal indents them,
    report.md makes them bullets."""
    lines = []
    for group in record["groups"]:
        lines.append((0, f"group {group['group']}: {'; '.join(group['table'])}"))
        if group["kind"] in ("mismatch", "missing"):
            lines.append((1, group["description"]))
    if record.get("ranks_without_trace"):
        lines.append((0, f"no trace from ranks {format_ranks(record['ranks_without_trace'])}"))
    lines.append((0, record["agreement"]))
    return lines
