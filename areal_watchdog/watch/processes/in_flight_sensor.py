"""The cheap hang sensor between looks: before the step threshold, all but a few ranks have had
the same collective in flight far longer than that operation has ever taken (and longer than
any step so far), and no rank moves real data by its own counters, no GPU works. Then the
leader looks at once (trigger ``collective_in_flight``) instead of waiting for the threshold,
from the first step on, warm-up or not; the look's evidence decides as any look's does, so the
sensor costs no false alarm, only a look.

The few ranks outside the collective are the suspects: one that spins (a runaway reward loop),
one blocked in its data loader or in a receive that never comes, one stopped; or the ranks of
one node, when every other node's are in it (a straggling node). Their CPU is no
movement; real I/O is (a rank-0 checkpoint while the others wait is the usual shape of a
save), and so is a GPU at work.

Each node senses its own ranks while the job is silent (``sense_after``) and publishes what it
read in its status (``Reading``); the leader's ``stuck_for`` combines the readings of every
node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from areal_watchdog.evidence.listeners.collectives_in_flight import InFlight, sense
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.watch.processes.node_watch import NodeWatch

SENSE_AFTER_MIN = 1.0  # seconds of silence before the ranks are asked, at least
IN_FLIGHT_MIN = 2.0  # seconds every rank's shared collective must be in flight, at least
IN_FLIGHT_FACTOR = 5.0  # ... and this many times the longest that operation took before
FEW = 8  # "all but a few": at most one rank in this many may be outside the collective (1 at least)


@dataclass(frozen=True)
class Reading:
    """One node's sensing: each answering rank's collectives in flight, the ranks that did
    not answer, the ranks that moved real data by their own counters, and whether a GPU here
    works."""

    at: float
    ranks: dict[int, list[InFlight]]
    silent: list[int]
    working: list[int]
    gpu_busy: bool = False
    took: float = 0.0  # seconds this sensing took (what it costs a poll)

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": round(self.at, 3),
            "ranks": {str(r): [i.to_list() for i in items] for r, items in self.ranks.items()},
            "silent": self.silent,
            "working": self.working,
            "gpu_busy": self.gpu_busy,
            "took": round(self.took, 4),
        }

    @classmethod
    def from_dict(cls, data: object) -> Reading | None:
        """A peer's published reading; None when there is none or it is malformed."""
        try:
            ranks = {int(r): [InFlight.from_list(i) for i in items]
                     for r, items in data["ranks"].items()}  # type: ignore[index]  # fmt: skip
            silent = [int(r) for r in data["silent"]]  # type: ignore[index]
            working = [int(r) for r in data["working"]]  # type: ignore[index]
            gpu = bool(data["gpu_busy"])  # type: ignore[index]
            return cls(float(data["at"]), ranks, silent, working, gpu)  # type: ignore[index]
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
        gpus = watch.gpus
        gpu_busy = any(gpus.state(g) == "working" for g in gpus.last)
        self.sense(now, sorted(watch.live), watch.ranks_at_work(), gpu_busy)

    def sense(self, now: float, ranks: list[int], working: list[int], gpu_busy: bool) -> None:
        """Ask this node's ranks (``working``: those that moved real data in their last poll
        window)."""
        started = time.perf_counter()
        answers = sense(self.layout, ranks)
        self.learn(now, answers)
        silent = [r for r in ranks if r not in answers]
        self.reading = Reading(now, answers, silent, working, gpu_busy,
                               time.perf_counter() - started)  # fmt: skip

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
        """How long the ranks may share ``op`` in flight: ``IN_FLIGHT_FACTOR`` times the
        longest it was seen to take, and never less than any step so far (``step``, the
        longest step interval: an operation never seen may fill a step) or 2 s."""
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
    """How far past its limit a collective that all but a few ranks (``FEW``), or all but one
    node's, share has been in flight (seconds, negative: not yet), and its operation;
    ``(-inf, "")`` when the readings do not cover every rank, a rank moves real data or a GPU
    works, or no collective is shared so widely. A collective that a rank has passed (it has a
    later one of the same group) has completed. ``limit(op)`` is the operation's limit."""
    nothing = (float("-inf"), "")
    answered: dict[int, list[InFlight]] = {}
    covered: set[int] = set()
    for reading in readings:
        if reading.gpu_busy or reading.working:
            return nothing
        answered.update(reading.ranks)
        covered |= set(reading.ranks) | set(reading.silent)
    if not answered or covered != set(range(world_size)):
        return nothing
    newest: dict[str, int] = {}
    members: dict[tuple[str, int], dict[int, InFlight]] = {}
    for rank, items in answered.items():
        for item in items:
            newest[item.pg] = max(newest.get(item.pg, item.seq), item.seq)
            members.setdefault((item.pg, item.seq), {})[rank] = item
    nodes = [set(r.ranks) | set(r.silent) for r in readings]
    best = nothing
    for (pg, seq), mine in members.items():
        if seq < newest[pg] or not _outside_are_few(covered - set(mine), world_size, nodes):
            continue
        age, op = now - max(i.since for i in mine.values()), next(iter(mine.values())).op
        best = max(best, (age - limit(op), op))
    return best


def _outside_are_few(outside: set[int], world_size: int, nodes: list[set[int]]) -> bool:
    """The ranks outside a collective are few (``FEW``), or are of one node while every other
    node's ranks are in it (a straggling or stopped node)."""
    if len(outside) <= max(1, world_size // FEW):
        return True
    return len(nodes) > 1 and any(outside <= ranks for ranks in nodes)
