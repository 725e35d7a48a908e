"""The classifier's answer as plain data: what each rank does, how ranks group, the verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from areal_watchdog.evidence.model import RankEvidence


@dataclass
class Activity:
    """What one rank is doing, reduced to what matters for classification."""

    kind: (
        str  # collective | p2p | init | cleanup | dataloader | rollout | running | exited | unknown
    )
    op: str  # the library call it waits in, or the innermost user function
    signature: str  # grouping key: op plus the user call sites
    where: str  # for people: "all_reduce at train.py:88 in step() <- main()"


@dataclass
class StackGroup:
    """Ranks that share one stack signature."""

    signature: str
    where: str
    kind: str
    ranks: list[int]


@dataclass
class Verdict:
    """The classifier's answer."""

    category: str
    confidence: float
    culprit_ranks: list[int]
    summary: str
    groups: list[StackGroup] = field(default_factory=list)
    culprit_nodes: list[str] = field(default_factory=list)
    collectives: dict[str, Any] | None = None  # the Flight Recorder analysis, when available
    cause: str | None = None  # rollout_stalled: why the rollouts do not come
    activities: dict[int, Activity] = field(default_factory=dict)  # what each rank is doing
    culprit_workers: list[dict[str, Any]] = field(default_factory=list)  # culprits, not ranks
    worker_activities: dict[int, Activity] = field(default_factory=dict)  # other parts, by pid


def culprit_entry(process: RankEvidence) -> dict[str, Any]:
    """A culprit that is not a rank (or not only one), as ``culprit_workers`` lists it: role,
    index, node, pid, rank, address (what is known)."""
    found = {
        "role": process.role or "rank",
        "index": process.worker_index,
        "node": process.node,
        "pid": process.pid,
        "rank": process.rank,
        "address": process.address,
    }
    return {k: v for k, v in found.items() if v is not None}
