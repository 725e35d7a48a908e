"""Silences that move without working, posted once as warnings while the hard limit still
decides: a possible livelock (a few ranks busy in their own code, no effect outside, while the
others wait) and a retry loop (every episode fails and is retried). A part of the escalation
(``escalation``), handed the clock, the hard limit and the desk it reports to."""

from __future__ import annotations

from collections.abc import Callable

from areal_watchdog.common.rankset import ranks_phrase
from areal_watchdog.config.model import HangAction
from areal_watchdog.diagnose.movement import marks
from areal_watchdog.watch.progress.stall_clock import StallClock
from areal_watchdog.watch.silence.stall_case import Desk, Look, StallCase, confirmation

# A possible livelock is posted as a warning after this long without a step (or 3 times the
# longest step interval, if longer): healthy phases measured here stay under it (one rank
# evaluating alone while the others wait: 35 s).
LIVELOCK_WARN_MIN = 90.0
LIVELOCK_WARN_FACTOR = 3.0


class BusyWarnings:
    """The warnings of a silence that moves without working, once per silence."""

    def __init__(
        self, clock: StallClock, say: Callable[[str], None], desk: Desk,
        cancel_after: Callable[[], float],
    ) -> None:  # fmt: skip
        self.clock, self.say, self.desk, self.cancel_after = clock, say, desk, cancel_after

    def livelock_after(self) -> float:
        """Seconds without a step before a rank busy with no effect is posted as a warning."""
        return max(LIVELOCK_WARN_MIN, LIVELOCK_WARN_FACTOR * self.clock.max_interval)

    def next_look(self, case: StallCase, planned: float | None, now: float) -> float | None:
        """The next look no later than the moment this silence's warning falls due, while it
        has not been posted: a threshold of 60 s early in a job must not carry a warning due
        at 90 s past the 120 s its users were promised."""
        if case.livelock_warned or planned is None:
            return planned
        return min(planned, now + max(0.0, self.livelock_after() - self.clock.silent_for(now)) + 1)

    def livelock(
        self, case: StallCase, first: Look, look: Look, what: list[str], now: float
    ) -> None:
        """A few ranks busy in their own code (their stacks move between ``first`` and
        ``look``) with no effect outside themselves (no step, no data, no message out) while
        the others wait: posted once per silence as a warning, past ``livelock_after``, with
        the functions every look saw them in; the hard limit still decides."""
        silent = self.clock.silent_for(now)
        if case.livelock_warned:
            return
        culprits = look.verdict.culprit_ranks
        pids = {r.pid for r in look.evidence.ranks if r.rank in culprits and r.pid is not None}
        for seen in (marks(x.evidence, x.step).functions for x in (first, look)):
            case.busy_in |= {t[0] for pid in pids for t in seen.get(pid, ()) if t}
        if silent < self.livelock_after():
            return
        case.livelock_warned = True
        functions = sorted(case.busy_in)
        decided = confirmation(case, 0.0, what, False, None, self.cancel_after())
        livelock = {"ranks": culprits, "functions": functions[:8], "silent_s": round(silent, 1)}
        decided.update(posted=True, warning=True, livelock=livelock)
        self.say(f"possible livelock ({ranks_phrase(culprits)} busy {silent:.0f} s with no "
                 "effect): posting a warning; the hard limit still decides")  # fmt: skip
        self.desk.report(case.trigger, look, HangAction.REPORT, decided)

    def retry_loop(self, case: StallCase, look: Look, what: list[str], now: float) -> None:
        """Every episode failing and retried (both looks name ``workflow_failing``) while the
        servers' work only feeds episodes that fail and no step comes: posted once per silence
        as a warning past ``livelock_after``, the exception it repeats quoted in the summary;
        the hard limit still decides."""
        silent = self.clock.silent_for(now)
        if case.livelock_warned or silent < self.livelock_after():
            return
        case.livelock_warned = True
        decided = confirmation(case, 0.0, what, False, None, self.cancel_after())
        decided.update(posted=True, warning=True, retry_loop={"silent_s": round(silent, 1)})
        self.say(f"every episode fails and is retried, no step for {silent:.0f} s: posting a "
                 "warning; the hard limit still decides")  # fmt: skip
        self.desk.report(case.trigger, look, HangAction.REPORT, decided)
