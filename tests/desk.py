"""The sidecar's incident desk less its processes and files, for the escalation's fast tests:
each look returns the next recorded evidence (``tests/data``), each report is kept, the clock is
the test's."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_watchdog.config.model import WatchdogSection
from areal_watchdog.diagnose.classify import classify
from areal_watchdog.evidence.model import Evidence
from areal_watchdog.evidence.trigger import Trigger
from areal_watchdog.watch.escalation import Escalation
from areal_watchdog.watch.progress import StallClock
from areal_watchdog.watch.stall_case import Look, StallCase

DATA = Path(__file__).parent / "data"
THRESHOLD = 30.0


def recorded(name: str) -> Evidence:
    return Evidence.from_dict(json.loads((DATA / name).read_text()))


@dataclass
class Info:
    watchdog: WatchdogSection


@dataclass
class Desk(Escalation):
    """The sidecar's incident desk, less its processes and files: each look returns the next
    recorded evidence, each report is kept."""

    evidence: list[Evidence]
    clock: StallClock = field(default_factory=lambda: StallClock(THRESHOLD, 60.0, started_at=0))
    info: Info = field(default_factory=lambda: Info(WatchdogSection(on_hang="cancel")))
    now: float = 0.0
    look_takes: float = 0.0
    case: StallCase | None = None
    cancelling: bool = False
    warned: set[tuple] = field(default_factory=set)
    reports: list[dict[str, Any]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def say(self, message: str) -> None:
        self.lines.append(message)

    def confirm_delay(self) -> float:
        return 10.0

    def look(self, trigger: Trigger, lost: tuple[str, ...], statuses: dict) -> Look:
        """The next recorded look; it begins now and takes ``look_takes`` seconds (a loaded
        machine's py-spy)."""
        evidence = self.evidence.pop(0) if len(self.evidence) > 1 else self.evidence[0]
        look = Look(evidence, classify(evidence), {}, self.clock.last_step, self.now, 0.0,
                    THRESHOLD)  # fmt: skip
        self.now += self.look_takes
        return look

    def report(self, trigger: Trigger, look: Look, action: str, confirmation=None, post=True):
        self.reports.append(
            {"category": look.verdict.category, "cause": look.verdict.cause, "action": action,
             "posted": post, "confirmation": confirmation, "at": look.at}
        )  # fmt: skip
        self.cancelling = self.cancelling or action == "cancel"

    def stall(self, at: float) -> None:
        """The threshold is crossed at ``at``: the first look (``Incidents.open``)."""
        self.now = at
        self.case = StallCase(Trigger.STALL, self.clock.last_step, (), "cancel")
        self.judge(self.look(Trigger.STALL, (), {}))

    def run_until(self, end: float, step_at: float | None = None) -> None:
        """The leader's polls, a second apart; a new step at ``step_at``."""
        while self.now < end and not self.cancelling:
            self.now += 1.0
            if step_at is not None and self.now >= step_at and self.clock.last_step == 3:
                self.clock.step(4, self.now)
            self.follow({}, self.now)


def desk(*evidence: Evidence) -> Desk:
    d = Desk(list(evidence))
    d.clock.step(3, 0.0)
    return d


def moving(evidence: Evidence) -> Evidence:
    """The same job a moment later, one rank's stack in another function."""
    later = copy.deepcopy(evidence)
    later.ranks[0].main_thread().frames[-1].name = "main_loop_elsewhere"
    return later
