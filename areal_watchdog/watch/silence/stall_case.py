"""The records a silence is followed with: each look taken at it, and the case that holds them
until a new step ends it (``escalation``, ``busy_warnings``), how a look at it was decided, and
what the escalation asks of the incident desk (``Desk``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from areal_watchdog.config.model import HangAction
from areal_watchdog.diagnose.verdict import Verdict
from areal_watchdog.evidence.model import Evidence
from areal_watchdog.evidence.trigger import Trigger


@dataclass
class Look:
    """One look at the job: the evidence, the verdict, what it cost, and the job as it stood
    then (a report describes its look, not the moment it is written)."""

    evidence: Evidence
    verdict: Verdict
    timings: dict[str, float]
    step: int | None
    at: float  # when the look began
    progress_at: float | None  # the last progress then (None: no step seen yet)
    threshold: float  # the stall threshold in force then


@dataclass
class StallCase:
    """One silence, followed until a new step ends it."""

    trigger: Trigger
    step: int | None  # the last step when it began: another one ends it
    lost: tuple[str, ...]
    action: HangAction  # the on_hang action it may run
    looks: int = 0
    last: Look | None = None  # the latest look
    pending: Look | None = None  # a first look waiting for its second
    due: float = 0.0  # when the second look is due
    next_look: float | None = None  # when to look again, after a dismissed or suspected look
    writing: bool = False  # past the hard limit, a process moved real data: next_look decides
    livelock_warned: bool = False  # the possible livelock was posted as a warning
    busy_in: set[str] = field(default_factory=set)  # the functions busy ranks were seen in
    moving: set[int] = field(default_factory=set)  # pids whose stacks moved at a second look
    written: tuple[Any, ...] | None = None  # the verdict of the last look written


class Desk(Protocol):
    """What the escalation asks of the incident desk: a look at the job, a report of one, and
    whether the job is being ended already."""

    cancelling: bool

    def look(self, trigger: Trigger, lost: tuple[str, ...], statuses: dict) -> Look: ...

    def report(
        self, trigger: Trigger, look: Look, action: HangAction,
        confirmation: dict[str, Any] | None = None, post: bool = True,
    ) -> None: ...  # fmt: skip


def confirmation(
    case: StallCase, after: float, what: list[str], confirmed: bool, by: str | None,
    cancel_after_s: float,
) -> dict[str, Any]:  # fmt: skip
    """``report.json``'s ``confirmation``: how a look at ``case`` was decided."""
    return {
        "after_s": round(max(after, 0.0), 3),
        "moved": what,
        "confirmed": confirmed,
        "by": by,
        "look": case.looks,
        "cancel_after_s": round(cancel_after_s, 3),
        "posted": confirmed,
    }
