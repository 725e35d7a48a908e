"""How the sidecar follows the job's progress: step lines (the leader), heartbeats (every node,
carried to the leader in statuses), announced pauses, the job's own step timings, its last step.
A part of ``Sidecar``, kept apart by concept."""

from __future__ import annotations

from areal_watchdog.rundir.beats import beats_node
from areal_watchdog.watch.progress import read_heartbeats
from areal_watchdog.watch.step_log import LINE_BUDGET_S
from areal_watchdog.watch.triggers import progressed


class ProgressWatch:
    """The sidecar's methods on progress; ``Sidecar`` holds the state they read."""

    def observe_progress(self, now: float, leading: bool, due: bool) -> None:
        """The leader follows the step lines, this node's heartbeats every poll and the other
        nodes' through their statuses; a follower reads its own ranks' heartbeats when its
        status is due (it carries them to the leader) and takes the job's progress from the
        leader's status, so that it is up to date the moment it has to lead."""
        steps = self.tail.poll() if leading else []
        for path, why in self.tail.refused.items():
            if path not in self.refusals_said:
                self.refusals_said.add(path)
                self.say(f"step lines in {path} do not count: {why} (it could fake progress)")
        if self.tail.slow_lines and not self.slow_said:
            self.slow_said = True
            self.say(
                f"watchdog.step_regex {self.info.watchdog.step_regex!r} took over "
                f"{LINE_BUDGET_S * 1000:.0f} ms on a log line (catastrophic backtracking?): such "
                "lines are skipped; simplify the pattern"
            )
        if leading or due:
            self.beats = read_heartbeats(self.layout, self.info.run_id, beats_node())
        steps += [s for s in (self.beats.max_step,) if s is not None]
        pause_until, pause_reason = self.beats.pause_until, self.beats.pause_reason
        for node, status in self.statuses.items():
            if node == self.node:
                continue
            steps += [s for s in (status.get("local_step"),) if isinstance(s, int)]
            if float(status.get("pause_until") or 0) > pause_until:
                pause_until, pause_reason = float(status["pause_until"]), status["pause_reason"]
            if not leading and node == self.coordinator.leader():
                self.clock.adopt(status.get("last_step"), status.get("last_progress_at"))
                total = status.get("total_steps")
                self.clock.total = total if isinstance(total, int) else self.clock.total
        progress = [s for s in steps if self.clock.step(s, now, self.tail.stamps.get(s))]
        if self.tail.phase and not progress:  # AReaL says what the silence is: it counts anew
            self.clock.hold(now)
            self.say(f"AReaL announced {self.tail.phase}: the silence counts from here")
        if pause_until > now:
            self.clock.hold(now)
            if pause_until != self.pause_said:
                self.pause_said = pause_until
                self.say(
                    f"pause announced ({pause_reason or 'no reason given'}): "
                    f"stall detection suspended for up to {pause_until - now:.0f} s"
                )
        totals = [t for t in (self.info.total_steps, self.tail.total) if t is not None]
        self.clock.total = min(totals) if totals else self.clock.total
        if not progress:
            return
        if leading:  # an incident a step came after is over (sinks that keep them open)
            self.notifier.progressed(self.clock.last_progress_at, self.clock.last_step)
        if self.clock.tearing_down:
            self.say(
                f"last step seen: step {self.clock.last_step} of {self.clock.total}; the job's "
                f"teardown counts as a hang after {self.clock.threshold:.0f} s"
            )
        elif self.reported.silence:
            self.say(f"progress resumed at step {self.clock.last_step}")
        elif self.clock.first_step_at == now:
            later = f", then step {progress[-1]}" if len(progress) > 1 else ""
            self.say(f"first step seen: step {progress[0]}{later}")  # the first, not the newest
        else:
            self.say("steps progressing")
        self.reported = progressed(self.reported)

    def learn_step_time(self) -> None:
        """Take the job's own step timings; say when they lift the threshold."""
        phases = self.tail.phases
        if phases.longest_step <= self.clock.learned_step:
            return
        before = self.clock.threshold
        self.clock.learned_step = phases.longest_step
        if self.clock.threshold > before and self.clock.stepped:
            self.say(
                f"steps of this job take up to {phases.longest_step:.0f} s ({phases.describe()}, "
                f"AReaL's timeperf): a silence counts as a stall after {self.clock.threshold:.0f} s"
            )
