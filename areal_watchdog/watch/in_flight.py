"""The cheap hang sensor between looks: before the step threshold, every rank has had the
same collective in flight far longer than that operation has ever taken, with no CPU or GPU at
work. Then the leader looks at once (trigger ``collective_in_flight``) instead of waiting for
the threshold; the look's evidence decides as any look's does, so the sensor costs no false
alarm, only a look.

Each node senses its own ranks while the job is silent (``sense_after``) and publishes what it
read in its status (``Reading``); the leader's ``stuck_for`` combines the readings of every
node. A rank that does not answer counts only when its CPU is idle (a rank stopped, or blocked
holding the GIL)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from areal_watchdog.evidence.in_flight import InFlight, sense
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.watch.node import NodeWatch

SENSE_AFTER_MIN = 1.0  # seconds of silence before the ranks are asked, at least
IN_FLIGHT_MIN = 2.0  # seconds every rank's shared collective must be in flight, at least
IN_FLIGHT_FACTOR = 5.0  # ... and this many times the longest that operation took before
IDLE_CPU = 0.2  # cores: a rank below this burns nothing (a blocked wait, a stopped process)


@dataclass(frozen=True)
class Reading:
    """One node's sensing: each answering rank's collectives in flight, the ranks that did
    not answer and burn no CPU, and whether anything here works (a busy CPU or a working
    GPU)."""

    at: float
    ranks: dict[int, list[InFlight]]
    idle_silent: list[int]
    busy: bool
    took: float = 0.0  # seconds this sensing took (what it costs a poll)

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": round(self.at, 3),
            "ranks": {str(r): [i.to_list() for i in items] for r, items in self.ranks.items()},
            "idle_silent": self.idle_silent,
            "busy": self.busy,
            "took": round(self.took, 4),
        }

    @classmethod
    def from_dict(cls, data: object) -> Reading | None:
        """A peer's published reading; None when there is none or it is malformed."""
        try:
            ranks = {int(r): [InFlight.from_list(i) for i in items]
                     for r, items in data["ranks"].items()}  # type: ignore[index]  # fmt: skip
            idle = [int(r) for r in data["idle_silent"]]  # type: ignore[index]
            return cls(float(data["at"]), ranks, idle, bool(data["busy"]))  # type: ignore[index]
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


@dataclass
class InFlightSensor:
    """This node's sensing, and what it learned of how long each operation takes."""

    layout: RunLayout
    longest: dict[str, float] = field(default_factory=dict)  # op -> longest seen in flight
    seen: dict[tuple[int, str, int], tuple[str, float]] = field(default_factory=dict)
    reading: Reading | None = None

    def poll(self, now: float, silent_for: float | None, median: object, watch: NodeWatch) -> None:
        """Sense while the job is silent past a usual step (``silent_for`` None: it is not, or
        a look or the threshold has taken over)."""
        if silent_for is None or not watch.live:
            self.forget()
            return
        if silent_for < sense_after(median if isinstance(median, (int, float)) else None):
            self.forget()
            return
        cpu = {r: w.utilization for r, w in watch.live.items() if w.utilization is not None}
        gpus = watch.gpus
        working = any(gpus.state(g) == "working" for g in gpus.last)
        self.sense(now, sorted(watch.live), cpu, working)

    def sense(self, now: float, ranks: list[int], cpu: dict[int, float], gpu_busy: bool) -> None:
        """Ask this node's ranks (``cpu``: each rank's recent CPU use, in cores)."""
        started = time.perf_counter()
        answers = sense(self.layout, ranks)
        self.learn(now, answers)
        silent = [r for r in ranks if r not in answers]
        busy = gpu_busy or any(cpu.get(r, 0.0) > IDLE_CPU for r in ranks)
        idle = [r for r in silent if r in cpu and cpu[r] <= IDLE_CPU]
        self.reading = Reading(now, answers, idle, busy, time.perf_counter() - started)

    def learn(self, now: float, answers: dict[int, list[InFlight]]) -> None:
        """A collective seen in flight and gone at the next reading completed: it took at
        least as long as it was seen in flight."""
        current = {(r, i.pg, i.seq): (i.op, now - i.since) for r, items in answers.items()
                   for i in items}  # fmt: skip
        for key, (op, age) in self.seen.items():
            if key[0] in answers and key not in current:
                self.longest[op] = max(self.longest.get(op, 0.0), age)
        self.seen = current

    def forget(self) -> None:
        """The job moved: the last reading describes a silence that ended."""
        self.reading = None

    def limit(self, op: str, step: object = None) -> float:
        """How long every rank may share ``op`` in flight: ``IN_FLIGHT_FACTOR`` times the
        longest it was seen to take, and never less than a usual step (``step``, the step
        intervals' 99th percentile: an operation never seen may fill a step) or 2 s."""
        usual = float(step) if isinstance(step, (int, float)) else 0.0
        return max(IN_FLIGHT_MIN, usual, IN_FLIGHT_FACTOR * self.longest.get(op, 0.0))


def sense_after(median_interval: float | None) -> float:
    """Seconds of silence before the ranks are asked: a step's usual length, at least 1 s (a
    job stepping in 0.3 s is never asked; one in the middle of a 60 s step is asked each poll
    from its 60th second)."""
    return max(SENSE_AFTER_MIN, median_interval or 0.0)


def stuck_for(
    readings: list[Reading], world_size: int, now: float, limit: Any
) -> tuple[float, str]:
    """How far past its limit the collective every rank shares has been in flight (seconds,
    negative: not yet), and its operation; ``(-inf, "")`` when the readings do not cover
    every rank, something works, or the ranks share no collective. ``limit(op)`` is the
    operation's limit."""
    nothing = (float("-inf"), "")
    answered: dict[int, list[InFlight]] = {}
    covered: set[int] = set()
    for reading in readings:
        if reading.busy:
            return nothing
        answered.update(reading.ranks)
        covered |= set(reading.ranks) | set(reading.idle_silent)
    if not answered or covered != set(range(world_size)):
        return nothing
    keys = [{(i.pg, i.seq) for i in items} for items in answered.values()]
    shared = set.intersection(*keys)
    best = nothing
    for pg, seq in shared:
        mine = [i for items in answered.values() for i in items if (i.pg, i.seq) == (pg, seq)]
        age, op = now - max(i.since for i in mine), mine[0].op
        best = max(best, (age - limit(op), op))
    return best
