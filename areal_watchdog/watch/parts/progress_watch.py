"""How the sidecar follows the job's progress: step lines (the leader), heartbeats (every node,
carried to the leader in statuses), announced pauses, the job's own step timings, its last step.
A part of the sidecar, handed what it reads (``shared``)."""

from __future__ import annotations

from areal_watchdog.rundir.progress.beats import beats_node
from areal_watchdog.watch.parts.shared import Collaborators, JobView
from areal_watchdog.watch.progress.heartbeats import read_heartbeats
from areal_watchdog.watch.progress.step_log import LINE_BUDGET_S, StepLogTail
from areal_watchdog.watch.silence.triggers import progressed


class ProgressWatch:
    """The sidecar's part that follows progress: the step log's tail, and what it said."""

    def __init__(self, kit: Collaborators, view: JobView, tail: StepLogTail) -> None:
        self.kit, self.view, self.tail = kit, view, tail
        self.refusals_said: set[str] = set()  # the logs whose step lines do not count, said
        self.slow_said = False  # a step regex too slow for a line, said
        self.pause_said = 0.0  # the end of the announced pause already said

    def observe(self, now: float, leading: bool, due: bool) -> None:
        """The leader follows the step lines, this node's heartbeats every poll and the other
        nodes' through their statuses; a follower reads its own ranks' heartbeats when its
        status is due (it carries them to the leader) and takes the job's progress from the
        leader's status, so that it is up to date the moment it has to lead."""
        kit, view, clock = self.kit, self.view, self.kit.clock
        steps = self.tail.poll() if leading else []
        self.say_refusals()
        if leading or due:
            view.beats = read_heartbeats(kit.layout, kit.info.run_id, beats_node())
        steps += [s for s in (view.beats.max_step,) if s is not None]
        pause_until, pause_reason = view.beats.pause_until, view.beats.pause_reason
        for node, status in view.statuses.items():
            if node == kit.node:
                continue
            steps += [s for s in (status.get("local_step"),) if isinstance(s, int)]
            if float(status.get("pause_until") or 0) > pause_until:
                pause_until, pause_reason = float(status["pause_until"]), status["pause_reason"]
            if not leading and node == kit.coordinator.leader():
                clock.adopt(status.get("last_step"), status.get("last_progress_at"))
                total = status.get("total_steps")
                clock.total = total if isinstance(total, int) else clock.total
        progress = [s for s in steps if clock.step(s, now, self.tail.stamps.get(s))]
        if self.tail.phase and not progress:  # AReaL says what the silence is: it counts anew
            clock.hold(now)
            kit.say(f"AReaL announced {self.tail.phase}: the silence counts from here")
        if pause_until > now:
            clock.hold(now)
            if pause_until != self.pause_said:
                self.pause_said = pause_until
                kit.say(
                    f"pause announced ({pause_reason or 'no reason given'}): "
                    f"stall detection suspended for up to {pause_until - now:.0f} s"
                )
        totals = [t for t in (kit.info.total_steps, self.tail.total) if t is not None]
        clock.total = min(totals) if totals else clock.total
        if progress:
            self.say_progress(progress, now, leading)

    def say_refusals(self) -> None:
        """Once each: a log whose step lines do not count, a step regex too slow for a line."""
        for path, why in self.tail.refused.items():
            if path not in self.refusals_said:
                self.refusals_said.add(path)
                self.kit.say(f"step lines in {path} do not count: {why} (it could fake progress)")
        if self.tail.slow_lines and not self.slow_said:
            self.slow_said = True
            self.kit.say(
                f"watchdog.step_regex {self.kit.info.watchdog.step_regex!r} took over "
                f"{LINE_BUDGET_S * 1000:.0f} ms on a log line (catastrophic backtracking?): such "
                "lines are skipped; simplify the pattern"
            )

    def say_progress(self, progress: list[int], now: float, leading: bool) -> None:
        """New steps: an incident they came after is over; say what they mean."""
        kit, clock = self.kit, self.kit.clock
        if leading:  # an incident a step came after is over (sinks that keep them open)
            kit.notifier.progressed(clock.last_progress_at, clock.last_step)
        if clock.tearing_down:
            kit.say(
                f"last step seen: step {clock.last_step} of {clock.total}; the job's "
                f"teardown counts as a hang after {clock.threshold:.0f} s"
            )
        elif self.view.reported.silence:
            kit.say(f"progress resumed at step {clock.last_step}")
        elif clock.first_step_at == now:
            later = f", then step {progress[-1]}" if len(progress) > 1 else ""
            kit.say(f"first step seen: step {progress[0]}{later}")  # the first, not the newest
        else:
            kit.say("steps progressing")
        self.view.reported = progressed(self.view.reported)

    def learn_step_time(self) -> None:
        """Take the job's own step timings; say when they lift the threshold."""
        phases, clock = self.tail.phases, self.kit.clock
        if phases.longest_step <= clock.learned_step:
            return
        before = clock.threshold
        clock.learned_step = phases.longest_step
        if clock.threshold > before and clock.stepped:
            self.kit.say(
                f"steps of this job take up to {phases.longest_step:.0f} s ({phases.describe()}, "
                f"AReaL's timeperf): a silence counts as a stall after {clock.threshold:.0f} s"
            )
