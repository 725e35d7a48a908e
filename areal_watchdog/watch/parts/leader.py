"""What the leading sidecar does each poll: a snapshot of the whole job (its own node and every
peer's published status), the pure trigger rules' decision on it (``triggers``), and the action
(say it, open an incident). A part of the sidecar, handed what it reads (``shared``) and
the job's end (``job_end``)."""

from __future__ import annotations

from dataclasses import replace

from areal_watchdog.diagnose.rollout_rules.server_calls import AwaitedServer
from areal_watchdog.evidence.trigger import SILENCES, Trigger
from areal_watchdog.watch.cluster.coordination import ENDED_STATES
from areal_watchdog.watch.parts.job_end import JobEnd
from areal_watchdog.watch.parts.shared import Collaborators, JobView
from areal_watchdog.watch.processes.in_flight_sensor import Reading, stuck_for
from areal_watchdog.watch.silence.triggers import Action, Say, Snapshot, decide


class Leader:
    """The sidecar's part that leads: every node's view, the trigger rules, the action."""

    def __init__(self, kit: Collaborators, view: JobView, job_end: JobEnd) -> None:
        self.kit, self.view, self.job_end = kit, view, job_end
        self.gone_since: float | None = None  # since when some ranks are gone and others live

    def lead(self, now: float) -> None:
        """Follow the silence under way (``escalation``); ask the trigger rules what to do, then do
        it. A job the user interrupts is no longer followed: its second look would find the
        ranks it stopped and take them for a crash."""
        if not self.job_end.ending_on_purpose():
            self.kit.incidents.escalation.follow(self.view.statuses, now)
        actions, self.view.reported = decide(self.snapshot(now), self.view.reported)
        for action in actions:
            self.act(action, now)

    def snapshot(self, now: float) -> Snapshot:
        exits = self.job_end.exit_records(read_silent=True)
        alive, gone = self.alive_ranks(), self.gone_ranks()
        if gone and alive:
            self.gone_since = self.gone_since or now
        wd = self.kit.info.watchdog
        said_ending = {n for n, st in self.view.statuses.items() if st.get("state") in ENDED_STATES}
        silent = self.kit.coordinator.lost_nodes(finished=set(exits) | said_ending)
        job_nodes = self.kit.info.nodes if self.kit.info.dynamic_nodes else self.kit.nodes
        over, op = self.in_flight_over(now)
        return Snapshot(
            now=now,
            first_step_seen=self.kit.clock.stepped,
            silent_for=self.kit.clock.silent_for(now),
            threshold=self.kit.clock.threshold,
            stalled=self.kit.clock.stalled(now),
            alive=frozenset(alive),
            others_alive=self.others_alive(),
            gone=frozenset(gone),
            gone_clean=gone <= self.finished_ranks(),
            gone_since=self.gone_since,
            crash_grace=wd.crash_grace,
            gpus_quiet_for=self.gpus_quiet_for(now),
            gpu_idle_timeout=wd.gpu.idle_timeout,
            in_flight_over=over,
            in_flight_op=op,
            silent_nodes=tuple(silent),
            servers_refusing=self.servers_refusing(),
            server_awaited=self.server_awaited(),
            in_kernel_for=self.in_kernel_for(now),
            ended_nodes=len([n for n in exits if n in job_nodes]),
            n_nodes=len(job_nodes),
            silent_job_nodes=len([n for n in silent if n in job_nodes]),
            failed=any(r.get("returncode") != 0 for r in exits.values()),
            ending_on_purpose=self.job_end.ending_on_purpose(),
        )

    def act(self, action: Action, now: float) -> None:
        if action.trigger in SILENCES and self.kit.incidents.case is not None:
            # A new silence (the job moved since the first look) while another waits for its
            # second look: once that is done, this one is seen afresh, never swallowed.
            self.view.reported = replace(self.view.reported, silence=False)
            return
        silent, threshold = self.kit.clock.silent_for(now), self.kit.clock.threshold
        alive = f"{len(self.alive_ranks())} ranks"
        if self.others_alive():
            alive += f" and {self.others_alive()} other processes"
        if action.trigger is Trigger.NODE_SILENT:
            self.kit.say(f"node(s) {', '.join(action.lost)} stopped answering: gathering evidence")
        elif action.trigger is Trigger.GPU_IDLE:
            self.kit.say(
                f"every GPU idle or spinning for {self.gpus_quiet_for(now):.0f} s with no "
                f"progress: gathering stacks from {alive}"
            )
        elif action.trigger is Trigger.IN_FLIGHT:
            self.kit.say(
                f"after {silent:.1f} s all but a few ranks wait in one {action.op} "
                f"far longer than it ever took, nothing moving data: gathering stacks from {alive}"
            )
        elif action.trigger is Trigger.SERVER_REFUSED:
            self.kit.say(
                f"inference server(s) {', '.join(action.servers)} refuse connections: gathering "
                f"evidence from {alive}"
            )
        elif action.trigger is Trigger.SERVER_CALL:
            self.kit.say(f"{action.awaited}: gathering evidence from {alive}")
        elif action.trigger is Trigger.IN_KERNEL:
            self.kit.say(
                f"ranks blocked in a file operation for {self.in_kernel_for(now):.0f} s with "
                f"nothing moving: gathering evidence from {alive}"
            )
        elif action.trigger is Trigger.STALL:
            self.kit.say(
                f"no progress for {silent:.1f} s (threshold {threshold:g} s): stall, "
                f"gathering stacks from {alive}"
            )
        elif action.say is Say.SUSPECTED:
            self.kit.say(
                f"no new step for {silent:.0f} s (threshold {threshold:g} s): stall suspected"
            )
        if action.trigger is not None:
            self.kit.incidents.open(action.trigger, self.view.statuses, action.lost)
        if action.say is Say.FINISHED:
            self.job_end.finish()

    def server_awaited(self) -> str:
        """The furthest past its limit of the servers keeping a call waiting, by this node's
        sensor or a peer's published one, said as a phrase; "" when none is."""
        found = [self.kit.server_calls.awaited] if self.kit.server_calls.awaited else []
        for node, status in self.view.statuses.items():
            peer = AwaitedServer.from_dict(status.get("server_awaited"))
            if node != self.kit.node and peer is not None:
                found.append(peer)
        return max(found, key=lambda a: a.past).phrase() if found else ""

    def in_flight_over(self, now: float) -> tuple[float, str]:
        """The sensor's readings of every node (this one's, and those the peers published). No
        peer status is parsed while this node's own ranks went unread: they are never covered."""
        kit, sensor = self.kit, self.kit.in_flight
        if sensor.reading is None and kit.watch.live:
            return float("-inf"), ""
        readings = [sensor.reading] if sensor.reading else []
        for node, status in self.view.statuses.items():
            published = status.get("in_flight")
            if node != kit.node and published and (peer := Reading.from_dict(published)):
                readings.append(peer)
        longest = kit.clock.max_interval
        return stuck_for(readings, kit.info.world_size, now, lambda op: sensor.limit(op, longest))

    def servers_refusing(self) -> tuple[str, ...]:
        """The job's inference servers, on every node, that answered once and refuse
        connections now; none once the job tears down (its servers are stopped then)."""
        if self.kit.clock.tearing_down:
            return ()
        found = set(self.kit.watch.servers_refusing())
        for node, status in self.view.statuses.items():
            if node != self.kit.node:
                found |= {str(a) for a in status.get("servers_refusing") or []}
        return tuple(sorted(found))

    def in_kernel_for(self, now: float) -> float:
        """How long the longest-blocked rank of the job, on any node, has been blocked in the
        kernel (D, or asleep in a file operation) with
        nothing moving (0: none is)."""
        since = list(self.kit.watch.in_kernel_since().values())
        for node, status in self.view.statuses.items():
            if node != self.kit.node:
                since += [float(t) for t in (status.get("ranks_in_kernel_since") or {}).values()
                          if isinstance(t, (int, float))]  # fmt: skip
        return now - min(since) if since else 0.0

    def gpus_quiet_for(self, now: float) -> float:
        """How long every GPU of the job, on every node that has GPUs, has done no work."""
        since = []
        if self.kit.watch.gpus.last:
            since.append(self.kit.watch.gpus.quiet_since)
        for node, status in self.view.statuses.items():
            if node != self.kit.node and status.get("gpus"):
                since.append(status.get("gpu_quiet_since"))
        quiet = [s for s in since if s is not None]
        if not since or len(quiet) < len(since):
            return 0.0
        return now - max(quiet)

    def alive_ranks(self) -> set[int]:
        ranks = set(self.kit.watch.live)
        for node, status in self.view.statuses.items():
            if node != self.kit.node:
                ranks |= {int(r) for r in status.get("ranks_alive", {})}
        return ranks

    def others_alive(self) -> int:
        """Live processes of the job that are not ranks, on every node."""
        count = len(self.kit.watch.workers)
        for node, status in self.view.statuses.items():
            if node != self.kit.node:
                count += len(status.get("workers_alive", []))
        return count

    def finished_ranks(self) -> set[int]:
        """The gone ranks, on every node, whose own exit record says they returned cleanly."""
        ranks = self.kit.watch.finished_ranks()
        for node, status in self.view.statuses.items():
            if node != self.kit.node:
                ranks |= set(status.get("ranks_done", []))
        return ranks

    def gone_ranks(self) -> set[int]:
        ranks = set(self.kit.watch.gone)
        for node, status in self.view.statuses.items():
            if node != self.kit.node:
                ranks |= set(status.get("ranks_gone", []))
        return ranks
