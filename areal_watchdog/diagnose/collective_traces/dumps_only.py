"""A verdict from the collective record alone: Flight Recorder dumps with no stacks beside them
(``areal-launch diagnose DIR`` on the files ``TORCH_NCCL_DUMP_ON_TIMEOUT`` wrote). Pure.

Rules, in order: a decisive mismatch names the ranks that diverged (``collective_mismatch``); a
tie names both sides and says so; ``all_to_all`` totals that disagree name no rank; ranks missing
from a collective that wait in no other one are stragglers (``straggler``: busy in their own
code, or dead); ranks that wait for each other across groups issued collectives in different
orders (``collective_mismatch``); every rank in the same last collective is ``collective_stuck``;
a record where everything completed says the hang is elsewhere (``unknown``).
"""

from __future__ import annotations

from dataclasses import dataclass

from areal_watchdog.common.rankset import ranks_phrase
from areal_watchdog.diagnose.collective_traces.collectives import CollectiveEvidence, GroupFinding
from areal_watchdog.diagnose.phrases import is_are


@dataclass
class RecordFinding:
    """What the record alone says; the classifier turns it into its Verdict."""

    category: str
    confidence: float
    culprit_ranks: list[int]
    summary: str


def record_finding(record: CollectiveEvidence) -> RecordFinding:
    """The verdict the collective record supports on its own."""
    finding = _finding(record)
    silent = record.ranks_without_trace
    if silent:
        dumps = "its dump was" if len(silent) == 1 else "their dumps were"
        finding.summary += f" No dump from {ranks_phrase(silent)} (dead, or {dumps} not written)."
    return finding


def _finding(record: CollectiveEvidence) -> RecordFinding:
    mismatches = [g for g in record.groups if g.kind == "mismatch"]
    decisive = record.decisive_mismatch
    if decisive is not None:
        return RecordFinding(
            "collective_mismatch",
            0.85,
            decisive.culprit_ranks,
            f"The collective record shows that {decisive.description}: "
            f"{ranks_phrase(decisive.culprit_ranks)} diverged.",
        )
    named = [g for g in mismatches if g.culprit_ranks]
    if named:
        first = named[0]
        return RecordFinding(
            "collective_mismatch",
            0.4 if first.tie else 0.5,
            first.culprit_ranks,
            f"The collective record shows that {first.description}.",
        )
    missing = [g for g in record.groups if g.kind == "missing"]
    if missing:  # ranks behind outrank a mismatch that names nobody
        return _missing(missing)
    if mismatches:
        return RecordFinding(
            "collective_mismatch",
            0.4,
            [],
            f"The collective record shows that {mismatches[0].description}.",
        )
    stuck = [g for g in record.groups if g.kind == "agree"]
    if stuck:
        return RecordFinding(
            "collective_stuck",
            0.5,
            [],
            f"The collective record shows {stuck[0].description}, and no rank behind or "
            f"diverging: suspect the network, NCCL or a frozen peer (or a hang outside "
            f"collectives: read the stacks).",
        )
    return RecordFinding(
        "unknown",
        0.2,
        [],
        "Every collective in the record completed: the hang is outside collectives; read the "
        "stacks.",
    )


def _missing(missing: list[GroupFinding]) -> RecordFinding:
    waiting = {r for g in missing for r in g.waiting}
    culprits = sorted({r for g in missing for r in g.culprit_ranks})
    free = [r for r in culprits if r not in waiting]
    first = next(g for g in missing if set(g.culprit_ranks) & set(free or culprits))
    if free:
        who = "a straggler in its own code" if len(free) == 1 else "stragglers in their own code"
        return RecordFinding(
            "straggler",
            0.7,
            free,
            f"The collective record shows that {first.description}; {ranks_phrase(free)} "
            f"{is_are(free)} in no other collective: {who} (or dead), not a code-path "
            f"difference.",
        )
    return RecordFinding(
        "collective_mismatch",
        0.5,
        culprits,
        f"The collective record shows {ranks_phrase(culprits)} waiting for each other in "
        f"different groups ({first.description}): collectives issued in different orders.",
    )
