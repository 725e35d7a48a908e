"""Every hang kind the classifier can name, declared once: its title, its severity, and how a
silence with that verdict escalates.

A category (``collective_mismatch``) or a cause (``reward_stuck``, under ``rollout_stalled``)
is one row below. What the rows decide:

- ``proof``: the evidence of one look is final (a crashed rank, a lost node, a server that
  refuses connections: nothing of those comes back), so the first look acts;
- ``time_decides``: no stack tells a slow phase from a hang (an episode inside a tool), so only
  the hard limit ends the silence, never a look;
- ``damage``: the job moves on but trains on wrong data (rewards that silently fall back to 0):
  posted once as a warning while it goes on, never cancelled for it;
- ``settle_s``: proof only once the silence has lasted this long: storage that stops answering
  can answer again (a server failing over), so it is final only at Linux NFS's own major
  timeout (``timeo=600``, 60 s, when the kernel says "server not responding").

The report's JSON Schema enums, the classifier's list of stack categories and the escalation
read these rows (``tests/test_kinds.py`` fails when one of them drifts).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

STORAGE_SETTLE_S = 60.0  # Linux NFS's major timeout over TCP (timeo=600 deciseconds)


class Severity(str, Enum):
    """How a sink shows a posted look: a hang (the job is or will be ended) or a warning."""

    CRITICAL = "critical"
    WARNING = "warning"


@dataclass(frozen=True)
class HangKind:
    """One category or cause, as people and the escalation see it."""

    name: str
    title: str
    severity: Severity = Severity.CRITICAL
    proof: bool = False
    time_decides: bool = False
    damage: bool = False
    failure: bool = False  # the job failed, nothing hung (a webhook's ``job.failed``)
    stacks: bool = False  # a category the stacks decide (the collective record may overrule)
    settle_s: float = 0.0  # proof only once the silence has lasted this long


CATEGORIES: tuple[HangKind, ...] = (
    HangKind("collective_mismatch", "Ranks called different collectives", stacks=True),
    HangKind("collective_stuck", "Every rank waits in one collective", stacks=True),
    HangKind("cleanup_deadlock", "Ranks deadlocked in cleanup", stacks=True),
    HangKind("straggler", "A rank is behind the others", stacks=True),
    HangKind("dataloader_stall", "The data loader stalled", stacks=True),
    HangKind("init_deadlock", "Ranks deadlocked in initialisation"),
    HangKind("p2p_mismatch", "Point-to-point sends and receives do not match", stacks=True),
    HangKind("rank_crashed", "A rank crashed", proof=True, failure=True),
    HangKind("node_lost", "A node was lost", proof=True),
    HangKind(
        "storage_stall",
        "Ranks are blocked on storage that stopped answering",
        proof=True,
        settle_s=STORAGE_SETTLE_S,
    ),
    HangKind("rollout_stalled", "Rollouts stalled"),
    HangKind("weight_sync_stuck", "A weight update never completed"),
    HangKind("unknown", "The job stalled", stacks=True),
)

CAUSES: tuple[HangKind, ...] = (
    HangKind("inference_unreachable", "An inference server refuses connections", proof=True),
    HangKind("inference_paused", "Generation paused and never resumed"),
    HangKind("inference_wedged", "An inference server stopped answering"),
    HangKind("workflow_stuck", "Episodes are stuck inside the workflow", time_decides=True),
    HangKind("staleness_blocked", "The staleness gate admits no rollout"),
    HangKind("workflow_failing", "Every episode fails and is retried"),
    HangKind(
        "reward_stuck",
        "Rewards are silently falling back to 0",
        Severity.WARNING,
        damage=True,
    ),
    HangKind("unknown", "Rollouts stalled for an unknown reason"),
)

_BY_CATEGORY = {k.name: k for k in CATEGORIES}
_BY_CAUSE = {k.name: k for k in CAUSES}


def kind_of(category: str, cause: str | None = None) -> HangKind:
    """The row that decides a verdict: its cause's where it has one, else its category's."""
    if cause and cause in _BY_CAUSE:
        return _BY_CAUSE[cause]
    return _BY_CATEGORY.get(category, _BY_CATEGORY["unknown"])


def names(rows: tuple[HangKind, ...], **flags: bool) -> frozenset[str]:
    """The names of the rows whose flags all have the values given (``proof=True``)."""
    return frozenset(k.name for k in rows if all(getattr(k, f) == v for f, v in flags.items()))


def title(report: dict[str, Any]) -> str:
    """A report's headline for people: the kind's title, a warning said as one."""
    kind = kind_of(str(report.get("category")), report.get("cause"))
    return f"Warning: {kind.title}" if kind.severity is Severity.WARNING else kind.title
