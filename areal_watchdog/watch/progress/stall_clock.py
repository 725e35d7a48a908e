"""When a silence is a stall: ``StallClock`` turns progress (steps, held silences, a leader's
clock adopted) into a stall decision, with a threshold fixed or learned (``auto``) from the
job's own step intervals."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from areal_watchdog.rundir.progress.pace import interval_summary

LEARNED_FACTOR = 1.5  # a silence shorter than this many of the longest step seen is no stall
WARMUP_INTERVALS = 3  # step intervals seen before the threshold follows their distribution
WARMUP_MIN = 60.0  # the least threshold while warming up: first steps load, compile, warm caches
INTERVALS_KEPT = 256  # the newest step intervals the quantile is taken over


@dataclass
class StallClock:
    """Decide when the job stalled: no new step for the threshold, paused time excluded.

    ``stall_timeout=None`` means ``auto`` (the default): the threshold follows the job's own
    step intervals (``learned_threshold``). After the job's last step (``total``, when its step
    lines say it) the silence is its teardown: a stall after ``teardown_timeout`` at the least
    (saving, closing the process groups and servers outlast a step, and a resume would have
    nothing left to train).
    """

    stall_timeout: float | None
    startup_timeout: float
    auto_factor: float = 3.0
    auto_min_timeout: float = 5.0
    teardown_timeout: float = 300.0
    total: int | None = None  # the job's last step, once a step line said it
    started_at: float = field(default_factory=time.time)
    last_progress_at: float = 0.0
    last_step: int | None = None
    first_step_at: float | None = None
    max_interval: float = 0.0
    learned_step: float = 0.0  # the longest step the job's own timings report (StepPhases)
    last_stamp: float | None = None  # the last step line's own timestamp, where it had one
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=INTERVALS_KEPT))
    intervals_seen: int = 0  # every interval ever measured (the metrics' histogram counts them)
    last_step_at: float | None = None  # when the last step was seen (its line's stamp if any)
    stats: dict[str, float | int | None] = field(default_factory=lambda: interval_summary([]))

    def __post_init__(self) -> None:
        self.last_progress_at = self.started_at

    def step(self, step: int, now: float, stamp: float | None = None) -> bool:
        """Record a step number; True when it is new progress (higher than any seen). The
        interval since the step before comes from the step lines' own timestamps (``stamp``)
        where both have one, else from the polls that saw them."""
        if self.last_step is not None and step <= self.last_step:
            return False
        if self.first_step_at is None:
            self.first_step_at = now
        elif self.last_step is not None:
            seen = now - self.last_progress_at
            stamped = None if stamp is None or self.last_stamp is None else stamp - self.last_stamp
            interval = stamped if stamped is not None and stamped >= 0 else seen
            self.max_interval = max(self.max_interval, interval)
            self.intervals.append(interval)
            self.intervals_seen += 1
            self.stats = interval_summary(list(self.intervals))  # once a step, not once a read
        self.last_step, self.last_stamp = step, stamp
        self.last_progress_at, self.last_step_at = now, stamp or now
        return True

    def adopt(self, step: object, progress_at: object) -> None:
        """Take the leader's view of progress (a follower keeps it, to lead if it must)."""
        if not isinstance(step, int) or not isinstance(progress_at, (int, float)):
            return
        if self.last_step is None or step > self.last_step:
            self.last_step = step
            self.first_step_at = self.first_step_at or float(progress_at)
        self.last_progress_at = max(self.last_progress_at, float(progress_at))

    def hold(self, now: float) -> None:
        """An announced pause is in force: the silence so far does not count."""
        self.last_progress_at = max(self.last_progress_at, now)

    @property
    def stepped(self) -> bool:
        """The job printed its first step: past its start-up, the step thresholds apply."""
        return self.first_step_at is not None

    @property
    def tearing_down(self) -> bool:
        """The job's last step was seen: what is left is its teardown."""
        if self.total is None or self.last_step is None:
            return False
        return self.last_step >= self.total

    @property
    def threshold(self) -> float:
        if not self.stepped:
            return self.startup_timeout
        if self.tearing_down:
            return max(self.teardown_timeout, self._stepping_threshold())
        return self._stepping_threshold()

    def _stepping_threshold(self) -> float:
        learned = LEARNED_FACTOR * self.learned_step
        if self.stall_timeout is not None:
            return max(self.stall_timeout, learned)
        if not self.intervals and not learned:  # the first step may have included start-up
            return max(self.startup_timeout, self.auto_min_timeout)
        return max(learned_threshold(self.stats, self.auto_factor, self.auto_min_timeout), learned)

    @property
    def stepping_basis(self) -> float:
        """The threshold a second look is timed by: the one in force, or while ``auto`` is
        still at the warm-up's floor, what the steps so far would give (``auto_factor`` times
        the longest interval, ``auto_min_timeout`` at the least)."""
        threshold = self.threshold
        if self.stall_timeout is not None or self.learned or not self.intervals:
            return threshold
        if self.tearing_down:
            return threshold
        quick = max(self.auto_min_timeout, self.auto_factor * self.max_interval,
                    LEARNED_FACTOR * self.learned_step)  # fmt: skip
        return min(threshold, quick)

    @property
    def automatic(self) -> bool:
        """The threshold is ``auto``: the job's own step intervals set it once learned."""
        return self.stall_timeout is None

    @property
    def learned(self) -> bool:
        """The threshold follows the job's own step intervals (``auto``, past the warm-up)."""
        return self.automatic and len(self.intervals) >= WARMUP_INTERVALS

    def silent_for(self, now: float) -> float:
        return now - self.last_progress_at

    def stalled(self, now: float) -> bool:
        return self.silent_for(now) > self.threshold

    def crossed_at(self) -> float:
        """When the current silence crossed (or will cross) the threshold."""
        return self.last_progress_at + self.threshold


def learned_threshold(stats: dict[str, float | int | None], margin: float, floor: float) -> float:
    """``auto``: ``margin`` times the 99th percentile of the step intervals seen (the newest
    ``INTERVALS_KEPT``, summarised by ``interval_summary``), never below ``floor``. Until
    ``WARMUP_INTERVALS`` intervals are seen the first steps (loading, compiling, warming
    caches) get ``WARMUP_MIN`` at the least, or 5 times the longest interval."""
    if int(stats["intervals"] or 0) < WARMUP_INTERVALS:
        return max(WARMUP_MIN, 5 * float(stats["longest"] or 0.0))
    return max(floor, margin * float(stats["p99"] or 0.0))
