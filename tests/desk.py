"""The sidecar's incident desk less its processes and files, for the escalation's fast tests:
each look returns the next recorded evidence (``tests/data``), each report is kept, the clock is
the test's."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from areal_watchdog.config.model import WatchdogSection
from areal_watchdog.diagnose.classify import classify
from areal_watchdog.evidence.model import Evidence
from areal_watchdog.evidence.trigger import Trigger
from areal_watchdog.watch.progress.stall_clock import StallClock
from areal_watchdog.watch.silence.escalation import Escalation
from areal_watchdog.watch.silence.stall_case import Look, StallCase

DATA = Path(__file__).parent / "data"
THRESHOLD = 30.0


def recorded(name: str) -> Evidence:
    return Evidence.from_dict(json.loads((DATA / name).read_text()))


class Desk:
    """The sidecar's incident desk, less its processes and files: each look returns the next
    recorded evidence, each report is kept; the escalation is the real one."""

    def __init__(self, evidence: list[Evidence]) -> None:
        self.evidence = evidence
        self.clock = StallClock(THRESHOLD, 60.0, started_at=0)
        self.now, self.look_takes = 0.0, 0.0
        self.cancelling = False
        self.reports: list[dict[str, Any]] = []
        self.lines: list[str] = []
        self.escalation = Escalation(
            WatchdogSection(on_hang="cancel"), self.clock, self.lines.append, self
        )

    @property
    def case(self) -> StallCase | None:
        return self.escalation.case

    def configure(self, **watchdog: Any) -> None:
        """Other settings, as a run configured with ``watchdog`` would have."""
        self.escalation.watchdog = WatchdogSection(on_hang="cancel", **watchdog)

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
        case = StallCase(Trigger.STALL, self.clock.last_step, (), "cancel")
        self.escalation.begin(case, self.look(Trigger.STALL, (), {}))

    def run_until(self, end: float, step_at: float | None = None) -> None:
        """The leader's polls, a second apart; a new step at ``step_at``."""
        while self.now < end and not self.cancelling:
            self.now += 1.0
            if step_at is not None and self.now >= step_at and self.clock.last_step == 3:
                self.clock.step(4, self.now)
            self.escalation.follow({}, self.now)


def desk(*evidence: Evidence) -> Desk:
    d = Desk(list(evidence))
    d.clock.step(3, 0.0)
    return d


def moving(evidence: Evidence) -> Evidence:
    """The same job a moment later, one rank's stack in another function."""
    later = copy.deepcopy(evidence)
    later.ranks[0].main_thread().frames[-1].name = "main_loop_elsewhere"
    return later
