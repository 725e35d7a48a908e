"""How a silence escalates to ``on_hang``: suspected, confirmed, or ended by the hard limit.

A silence is followed until a new step ends it, never forgotten after one look. How a look's
verdict escalates is declared with its kind (``diagnose.kinds``):

- proof acts at the first look: a rank crashed, a node was lost, an inference server refuses
  connections, or the Flight Recorder shows ranks that issued different operations at one
  sequence number (a decisive mismatch): nothing of those comes back;
- a verdict the stacks can prove (a mismatch of stacks alone, a wedged or paused server, a retry
  loop) is confirmed by a second look a few seconds later that finds nothing moved;
- a wait on something outside the job whose end no evidence shows (an episode inside a tool,
  ``workflow_stuck``), or ranks that are all in their own code with none waiting on another
  (idle: an unannounced save; or running: every rank evaluating on the CPU), is only
  suspected: a slow phase and a dead one have the same stack, so time decides, whatever moment
  a look runs;
- damage (rewards silently falling back to 0) is posted once as a warning at the look that finds
  it, and the job goes on; completions that are the damage itself (rewards scored 0 after a
  timeout) are no movement;
- a dismissed or suspected look is written to the run directory (``status`` shows it), not
  posted; the leader looks again at most once per stall threshold, and a later look may confirm;
- the hard limit: no new step for ``watchdog.cancel_after`` seconds runs ``on_hang`` whatever
  moved meanwhile: movement without steps for that long is a livelock or a retry loop. It wins
  over a second look due at the same poll, and a second look that ends past it is named for it.
  By default ``CANCEL_AFTER_FACTOR`` times the threshold or the job's longest step interval so
  far, whichever is longer (the job's history: a job whose steps wait 25 s on a saturated server
  is not ended for it; nvidia-resiliency-ext learns its timeouts the same way). One thing
  outlasts it: a process that read or wrote real data since the last look by its own counters
  (a large model's first checkpoint can write for more than 10 minutes). The limit then looks
  again a threshold later, and ends the job the first time nothing moves data, or at
  ``DEFER_CAP_FACTOR`` hard limits whatever moves; a job that only spins is ended at once.
  What a process writes to its own logs is no data (``evidence.kernel_readings.log_writes``): a
  retry loop that logs every failure is ended at the limit.

``Escalation`` is a part of the incident desk (``incident``), handed the clock, the settings and
the desk it asks for looks and reports (``Desk``); the decisions on plain values are the
functions below it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from areal_watchdog.common.rankset import culprits_phrase, ranks_phrase
from areal_watchdog.config.model import HangAction, WatchdogSection
from areal_watchdog.diagnose.movement import (
    RETRY_LOOPS,
    STACKS_MOVED,
    busy_io,
    marks,
    moved,
    only_stacks_moved,
    stacks_moved,
)
from areal_watchdog.diagnose.strength import DAMAGE, settles_in, strength, verdict_key
from areal_watchdog.evidence.trigger import Trigger
from areal_watchdog.watch.progress.stall_clock import StallClock
from areal_watchdog.watch.silence.busy_warnings import BusyWarnings
from areal_watchdog.watch.silence.stall_case import Desk, Look, StallCase, confirmation

MIN_CONFIRM_S = 2.0  # the shortest wait between the two looks of a silence
CANCEL_AFTER_FACTOR = 5.0  # the default hard limit, in stall thresholds or step intervals
# The least default hard limit under a learned threshold: a threshold of seconds starts looks,
# but a silent phase that moves (an evaluation on the GPU, a checkpoint written) is ended only
# after this long without a step.
LEARNED_CANCEL_AFTER_MIN = 600.0
# Past this many hard limits without a step, data still moving defers the hard limit no more:
# a job that writes for ever without a step (a log flood the counters could not tell apart,
# through a pipe) is ended too.
DEFER_CAP_FACTOR = 3.0


class Escalation:
    """The incident desk's part that follows a silence (``case``) from its first look to its
    end: a new step, a confirmation, or the hard limit."""

    def __init__(
        self, watchdog: WatchdogSection, clock: StallClock, say: Callable[[str], None], desk: Desk
    ) -> None:
        self.watchdog, self.clock, self.say, self.desk = watchdog, clock, say, desk
        self.case: StallCase | None = None  # a silence, followed until a step
        self.warned: set[tuple] = set()  # damage already posted as a warning
        self.warnings = BusyWarnings(clock, say, desk, self.cancel_after)

    def cancel_after(self) -> float:
        """The hard limit in force: ``watchdog.cancel_after``, else a multiple of the threshold
        or of the longest step interval seen, whichever is longer (``LEARNED_CANCEL_AFTER_MIN``
        at the least under a learned threshold)."""
        configured = self.watchdog.cancel_after
        if configured is not None:
            return configured
        limit = CANCEL_AFTER_FACTOR * max(self.clock.threshold, self.clock.max_interval)
        return max(limit, LEARNED_CANCEL_AFTER_MIN) if self.clock.automatic else limit

    def open_look(self) -> tuple[str | None, str]:
        """The look open at this silence, for ``status``: what it suspects, and what decides it
        (``pending``: a second look; ``time``: the hard limit; ``moved``: it saw movement and
        looks again a threshold later)."""
        case = self.case
        if case is None or case.last is None:
            return None, ""
        verdict = case.last.verdict
        found = verdict.category + (f" ({verdict.cause})" if verdict.cause else "")
        if case.pending is not None:
            return f"look {case.looks} suspects {found}, a second look pending", "pending"
        if strength(verdict) == "time":
            return f"look {case.looks} suspects {found}", "time"
        return f"look {case.looks} suspected {found}, but something moved; looking again", "moved"

    def confirm_delay(self) -> float:
        """Seconds between the two looks: ``watchdog.confirm_after``, or by default half the
        stall threshold (while it is still the warm-up's floor, half of what the steps so far
        would give), between 2 and 10 s; 2 s after the rollout side's sensor, which watched
        the held call for 5 s and five times its usual before the first look."""
        configured = self.watchdog.confirm_after
        if configured is not None:
            return configured
        if self.case is not None and self.case.trigger is Trigger.SERVER_CALL:
            return MIN_CONFIRM_S
        return round(min(10.0, max(MIN_CONFIRM_S, self.clock.stepping_basis / 2)), 1)

    def begin(self, case: StallCase, look: Look) -> None:
        """A new silence, and the first look at it."""
        self.case = case
        self.judge(case, look)

    def judge(self, case: StallCase, look: Look) -> None:
        """A first look at the silence: act, wait for a second look, or wait for time (each
        counted from when the look began); damage is posted as a warning first."""
        case.looks += 1
        case.last = look
        kind, verdict = strength(look.verdict), look.verdict
        culprits = culprits_phrase(verdict.culprit_ranks, verdict.culprit_workers)
        self.warn(case, look)
        delay = self.confirm_delay()
        settle = settles_in(verdict, self.clock.silent_for(look.at))
        if kind == "conclusive" and settle > 0:
            self.suspect(case, look, [], look.at, "")
            case.next_look = look.at + min(settle + 1.0, self.clock.threshold)
            self.say(
                f"{verdict.category} suspected ({culprits}): it may answer again (a failover); "
                f"final if it still does not in {settle:.0f} s, looking again in "
                f"{case.next_look - look.at:.0f} s"
            )
        elif kind == "conclusive" or delay <= 0:
            self.conclude(case, look, "evidence" if kind == "conclusive" else "first_look", 0.0, [])
        elif kind == "time":
            self.suspect(case, look, [], look.at, f"{verdict.category} suspected ({culprits})")
        else:
            case.pending, case.due = look, look.at + delay
            self.say(
                f"{verdict.category} suspected ({culprits}); a second look in {delay:g} s "
                "before it is reported"
            )

    def warn(self, case: StallCase, look: Look) -> None:
        """Damage (the job goes on, silently wrong) is posted once per run and finding as a
        warning: ``action: report``, never ended for it."""
        verdict = look.verdict
        if verdict.cause not in DAMAGE or verdict_key(verdict) in self.warned:
            return
        self.warned.add(verdict_key(verdict))
        self.say(f"{verdict.cause}: the job goes on silently wrong; posting a warning")
        confirmation = self.confirmation(case, 0.0, [], confirmed=False, by=None)
        confirmation.update(posted=True, warning=True)
        self.desk.report(case.trigger, look, HangAction.REPORT, confirmation)
        case.written = verdict_key(verdict)  # the warning is this finding's record

    def follow(self, statuses: dict, now: float) -> None:
        """Each poll of the leader: the hard limit first, then the second look once due, then
        another look once a threshold passed; a new step ends the case (after its pending
        second look)."""
        case = self.case
        if case is None or self.desk.cancelling:
            return
        stepped = self.clock.last_step != case.step
        if stepped and case.pending is None:  # the step ended the silence
            self.case = None
        elif not stepped and self.past_limit(now) and not self.still_writing(case, now):
            case.pending = None  # due together: the hard limit decides, and says so
            self.hard_limit(case, statuses, now)
        elif case.pending is not None:
            if now >= case.due:
                self.second_look(case, case.pending, statuses, now)
        elif case.next_look is not None and now >= case.next_look:
            case.next_look = None
            self.say(f"still no new step: look {case.looks + 1} at the silence")
            self.judge(case, self.desk.look(case.trigger, case.lost, statuses))

    def still_writing(self, case: StallCase, now: float) -> bool:
        """Past the hard limit, the last look saw real data moving: wait for the next look
        (until ``DEFER_CAP_FACTOR`` hard limits)."""
        waiting = case.writing and case.next_look is not None and now < case.next_look
        return waiting and not self.past_cap(now)

    def past_cap(self, at: float) -> bool:
        """No new step for ``DEFER_CAP_FACTOR`` hard limits: moving data defers no more."""
        return self.clock.silent_for(at) >= DEFER_CAP_FACTOR * self.cancel_after()

    def past_limit(self, at: float) -> bool:
        """No new step for the hard limit at ``at``."""
        return self.clock.silent_for(at) >= self.cancel_after()

    def second_look(self, case: StallCase, first: Look, statuses: dict, now: float) -> None:
        """Cancel when nothing moved since the first look; else dismiss it (written, not
        posted) and look again later. A look whose cause only time decides never ends the job:
        the hard limit does, and a second look that began past it is named for it."""
        case.pending = None
        second = self.desk.look(case.trigger, case.lost, statuses)
        case.last = second
        causes = {first.verdict.cause, second.verdict.cause}
        retrying = len(causes) == 1 and causes <= RETRY_LOOPS
        what = moved(marks(first.evidence, first.step), marks(second.evidence, second.step),
                     steps_only=retrying, damage=bool(causes & DAMAGE))  # fmt: skip
        what = what or self.moved_before(case, second)
        after = second.at - first.at
        self.warn(case, second)
        if what:
            case.moving |= stacks_moved(marks(first.evidence, first.step),
                                        marks(second.evidence, second.step))  # fmt: skip
            self.say(f"second look: {'; '.join(what)}: not cancelling")
            self.suspect(case, first, what, now, "", after)
            if only_stacks_moved(what) and second.verdict.category == "straggler":
                self.warnings.livelock(case, first, second, what, now)
                case.next_look = self.warnings.next_look(case, case.next_look, now)
            elif retrying and second.step == first.step:
                self.warnings.retry_loop(case, second, what, now)
                case.next_look = self.warnings.next_look(case, case.next_look, now)
        elif self.past_limit(second.at) and second.step == case.step:
            self.conclude(case, second, "hard_limit", after, [])
        elif strength(second.verdict) == "time":
            culprits = culprits_phrase(second.verdict.culprit_ranks, second.verdict.culprit_workers)
            self.suspect(case, second, [], now, f"{second.verdict.category} suspected ({culprits})")
        else:
            self.conclude(case, second, "second_look", after, [])

    def moved_before(self, case: StallCase, look: Look) -> list[str]:
        """The culprits whose stacks moved at an earlier second look of this silence: a rank
        going through several functions (an evaluation, a livelock) is sometimes sampled in
        one at both looks, and that luck must not end a job it never ended before (time does:
        the livelock warning, the hard limit). A rank spinning on one line never moved."""
        pids = {r.pid for r in look.evidence.ranks if r.rank in look.verdict.culprit_ranks}
        again = sorted(p for p in pids & case.moving if p is not None)
        if not again:
            return []
        return [f"{STACKS_MOVED} {', '.join(map(str, again[:5]))} changed at an earlier look"]

    def hard_limit(self, case: StallCase, statuses: dict, now: float) -> None:
        """No new step for ``cancel_after``: act, saying what moved since the last look; unless
        a process moved real data since then (``busy_io``): a job writing at a real rate is
        looked at again a threshold later, never ended for it."""
        look = self.desk.look(case.trigger, case.lost, statuses)
        before = case.last or look
        first, second = marks(before.evidence, before.step), marks(look.evidence, look.step)
        what, writing = moved(first, second), busy_io(first, second)
        limit = self.cancel_after()
        silent = self.clock.silent_for(now)
        if writing and look is not before and not self.past_cap(now):
            case.last, case.writing = look, True
            self.say(
                f"no new step for {silent:.0f} s, past the hard limit (watchdog.cancel_after "
                f"{limit:g} s), but {writing[0]}: looking again in {self.clock.threshold:g} s"
            )
            self.suspect(case, look, what, now, "")
            return
        self.say(
            f"no new step for {silent:.0f} s: the hard limit "
            f"(watchdog.cancel_after {limit:g} s) runs on_hang={case.action}"
        )
        self.conclude(case, look, "hard_limit", look.at - before.at, what)

    def suspect(
        self,
        case: StallCase,
        look: Look,
        what: list[str],
        now: float,
        line: str,
        after: float = 0.0,
    ) -> None:
        """A look that does not end the job: written once per finding, never posted; the next
        look a threshold after ``now``."""
        case.next_look = now + self.clock.threshold
        limit = self.cancel_after()
        if line:
            self.say(
                f"{line}: no stack tells a slow phase from a hang here; looking again in "
                f"{self.clock.threshold:g} s, on_hang={case.action} after {limit:g} s without a "
                "step"
            )
        key = verdict_key(look.verdict)
        if key == case.written and not what:
            return
        case.written = key
        confirmation = self.confirmation(case, after, what, confirmed=False, by=None)
        self.desk.report(case.trigger, look, HangAction.REPORT, confirmation, post=False)

    def conclude(self, case: StallCase, look: Look, by: str, after: float, what: list[str]) -> None:
        """The silence is a hang: report (posted) and run ``on_hang``."""
        self.case = None
        confirmation = self.confirmation(case, after, what, confirmed=True, by=by)
        self.desk.report(case.trigger, look, case.action, confirmation)

    def confirmation(
        self, case: StallCase, after: float, what: list[str], confirmed: bool, by: str | None
    ) -> dict[str, Any]:
        """``report.json``'s ``confirmation``: how this look was decided."""
        return confirmation(case, after, what, confirmed, by, self.cancel_after())


def summary_prefix(confirmation: dict[str, Any]) -> str:
    """What a report's summary says first about how its look was decided."""
    what = "; ".join(confirmation["moved"])
    if confirmation["by"] == "hard_limit":
        moving = f" ({what})" if what else ""
        return (
            f"No new step for watchdog.cancel_after ({confirmation['cancel_after_s']:g} s): "
            f"a hang whatever moved meanwhile{moving}. "
        )
    if retry := confirmation.get("retry_loop"):
        return (
            f"Warning: every episode fails and is retried: no step for {retry['silent_s']:.0f} s "
            "while the inference servers' work only feeds episodes that fail; the hard limit "
            f"(watchdog.cancel_after {confirmation['cancel_after_s']:g} s) ends the job if no "
            "step comes. "
        )
    if livelock := confirmation.get("livelock"):
        functions = ", ".join(f"{f}()" for f in livelock["functions"]) or "its own code"
        return (
            f"Warning: a possible livelock: {ranks_phrase(livelock['ranks'])} busy for "
            f"{livelock['silent_s']:.0f} s without a step, in {functions}, with no effect "
            "outside (no step, no data written, no message out) while the others wait; the "
            f"hard limit (watchdog.cancel_after {confirmation['cancel_after_s']:g} s) ends the "
            "job if no step comes. "
        )
    if confirmation.get("warning"):
        return "Warning: the job goes on, but it is silently wrong (not cancelled). "
    if confirmation["confirmed"]:
        return ""
    if what:
        return (
            f"Suspected, not confirmed: on a second look {confirmation['after_s']:.1f} s later "
            f"{what}, so the job was not cancelled. "
        )
    return (
        "Suspected, not confirmed: no stack tells a slow phase from a hang here, so the job is "
        f"ended only if no step comes within watchdog.cancel_after "
        f"({confirmation['cancel_after_s']:g} s). "
    )


def busy_without_effect(what: list[str]) -> bool:
    """Only stacks moved between the looks (no step, data, GPU, server or completed task)."""
    return bool(what) and all(
        " changed" in line and line.startswith("the stacks of") for line in what
    )
