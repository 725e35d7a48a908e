"""The hang classifier: a pure function from gathered evidence to a verdict.

Ranks are grouped by stack signature (the user's call sites plus the library call they are
blocked in; library internals folded). The dominant group is usually healthy; the outliers point
at the culprit. What each process does is ``activity``; the patterns are ``rules``; the rollout
side is ``rollout``; the Flight Recorder record is ``collectives``. See
``docs/hang-categories.md`` for the evidence behind each category.
"""

from __future__ import annotations

from typing import Any

from areal_watchdog.common.rankset import ranks_phrase
from areal_watchdog.diagnose.collective_traces.collectives import analyse
from areal_watchdog.diagnose.collective_traces.dumps_only import record_finding
from areal_watchdog.diagnose.kinds import CATEGORIES, names
from areal_watchdog.diagnose.one_process.activity import describe
from areal_watchdog.diagnose.one_process.children import children_note
from areal_watchdog.diagnose.one_process.log_flood import flood_note
from areal_watchdog.diagnose.patterns.rules import decide
from areal_watchdog.diagnose.rollout_rules.rollout import RolloutFinding, rollout_finding
from areal_watchdog.diagnose.verdict import Activity, StackGroup, Verdict
from areal_watchdog.evidence.model import EXITED, Evidence, RankEvidence


def classify(evidence: Evidence) -> Verdict:
    """Classify a stall or failure; never raises on odd evidence, falls back to ``unknown``.

    Evidence with no rank at all but Flight Recorder dumps (``areal-launch diagnose DIR``) is
    judged on the collective record alone."""
    if not evidence.ranks and _dumps(evidence):
        return _from_record(evidence)
    activities = {r.rank: describe(r) for r in evidence.ranks}
    groups = _group(evidence.ranks, activities)
    finding = rollout_finding(evidence)
    verdict = _from_finding(finding) if finding else decide(evidence, activities)
    for note in (children_note(verdict, evidence), flood_note(verdict, evidence)):
        verdict.summary = f"{verdict.summary} {note}" if note else verdict.summary
    verdict.groups = groups
    verdict.activities = activities
    verdict.worker_activities = {w.pid or 0: describe(w) for w in evidence.workers}
    _weigh_collectives(verdict, evidence)
    nodes = {r.rank: r.node for r in evidence.ranks}
    culprit_nodes = {nodes[r] for r in verdict.culprit_ranks if nodes.get(r)}
    culprit_nodes |= {w["node"] for w in verdict.culprit_workers if w.get("node")}
    if verdict.category == "node_lost":
        culprit_nodes |= set(evidence.lost_nodes)
    verdict.culprit_nodes = sorted(culprit_nodes)
    return verdict


def ended_cleanly(evidence: Evidence) -> bool:
    """Every process of the job exited, each with code 0: a silence at the end of a job, not
    a hang (the ranks' teardown can outlast the stall threshold before the launcher records
    the end). A process still alive (an AReaL controller stuck in its teardown) is no end."""
    processes = evidence.processes()
    return bool(processes) and all(
        p.state == EXITED and p.exit is not None and p.exit.code == 0 and not p.exit.exc_type
        for p in processes
    )


def _from_finding(finding: RolloutFinding) -> Verdict:
    return Verdict(
        category=finding.category,
        confidence=finding.confidence,
        culprit_ranks=finding.culprit_ranks,
        summary=finding.summary,
        cause=finding.cause,
        culprit_workers=finding.culprit_workers,
    )


HANG_CATEGORIES = names(CATEGORIES, stacks=True)  # what the collective record may overrule


def _dumps(evidence: Evidence) -> dict[int, dict[str, Any]]:
    """Every rank's trace, those with no entry included (a rank that issued no collective
    is behind, not absent); ranks that answered with an error have none."""
    dumps = {
        int(r): t
        for r, t in evidence.flight_records.items()
        if isinstance(t, dict) and isinstance(t.get("entries"), list) and "error" not in t
    }
    return dumps if any(t["entries"] for t in dumps.values()) else {}


def _from_record(evidence: Evidence) -> Verdict:
    record = analyse(_dumps(evidence), evidence.world_size)
    finding = record_finding(record)
    return Verdict(
        finding.category,
        finding.confidence,
        finding.culprit_ranks,
        finding.summary,
        collectives={**record.to_dict(), "agreement": "no stacks: the collective record alone"},
    )


def _weigh_collectives(verdict: Verdict, evidence: Evidence) -> None:
    """Put the Flight Recorder record beside the stacks: a decisive mismatch (operations that
    disagree at one sequence id, not a tie) decides which rank diverged; the report says whether
    the two agree."""
    dumps = _dumps(evidence)
    if not dumps:
        return
    record = analyse(dumps, evidence.world_size)
    named = record.culprit_ranks
    before = (verdict.category, list(verdict.culprit_ranks))
    finding = record.decisive_mismatch
    if (
        finding is not None
        and verdict.category in HANG_CATEGORIES
        and set(named) != set(verdict.culprit_ranks)
    ):
        stacks_said = (
            f"the stacks alone suggested {before[0]} naming "
            f"{ranks_phrase(before[1]) if before[1] else 'no rank'}"
        )
        verdict.category, verdict.culprit_ranks, verdict.confidence = (
            "collective_mismatch",
            named,
            0.9,
        )
        verdict.summary = (
            f"The collective record shows that {finding.description}: "
            f"{ranks_phrase(named)} diverged ({stacks_said})."
        )
    if not named or not before[1]:
        agreement = (
            "the collective record names no rank" if not named else "the stacks named no rank"
        )
        if not named and record.ranks_without_trace:
            agreement += f" ({ranks_phrase(record.ranks_without_trace)} sent no trace in time)"
    elif set(named) == set(before[1]):
        agreement = "the stacks and the collective record name the same ranks"
    else:
        agreement = (
            f"the stacks named {ranks_phrase(before[1])}, the collective record "
            f"{ranks_phrase(named)}"
        )
    verdict.collectives = {**record.to_dict(), "agreement": agreement}


def _group(ranks: list[RankEvidence], activities: dict[int, Activity]) -> list[StackGroup]:
    by_signature: dict[str, StackGroup] = {}
    for rank in ranks:
        act = activities[rank.rank]
        group = by_signature.setdefault(
            act.signature, StackGroup(act.signature, act.where, act.kind, [])
        )
        group.ranks.append(rank.rank)
    return sorted(by_signature.values(), key=lambda g: (-len(g.ranks), min(g.ranks)))
