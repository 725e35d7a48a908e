"""What the leading sidecar does each poll: a snapshot of the whole job (its own node and every
peer's published status), the pure trigger rules' decision on it (``triggers``), and the action
(say it, open an incident). A part of ``Sidecar``, kept apart by concept, as ``job_end`` is."""

from __future__ import annotations

from dataclasses import replace

from areal_watchdog.diagnose.server_calls import AwaitedServer
from areal_watchdog.evidence.trigger import SILENCES, Trigger
from areal_watchdog.watch.coordination import ENDED_STATES
from areal_watchdog.watch.in_flight import Reading, stuck_for
from areal_watchdog.watch.triggers import Action, Say, Snapshot, decide


class Leader:
    """The sidecar's methods as the leader; ``Sidecar`` holds the state they read."""

    def lead(self, now: float) -> None:
        """Follow the silence under way (``escalation``); ask the trigger rules what to do, then do
        it. A job the user interrupts is no longer followed: its second look would find the
        ranks it stopped and take them for a crash."""
        if not self.ending_on_purpose():
            self.incidents.follow(self.statuses, now)
        actions, self.reported = decide(self.snapshot(now), self.reported)
        for action in actions:
            self.act(action, now)

    def snapshot(self, now: float) -> Snapshot:
        exits = self.exit_records(read_silent=True)
        alive, gone = self.alive_ranks(), self.gone_ranks()
        if gone and alive:
            self.gone_since = self.gone_since or now
        wd = self.info.watchdog
        said_ending = {n for n, st in self.statuses.items() if st.get("state") in ENDED_STATES}
        silent = self.coordinator.lost_nodes(finished=set(exits) | said_ending)
        job_nodes = self.info.nodes if self.info.dynamic_nodes else self.nodes
        over, op = self.in_flight_over(now)
        return Snapshot(
            now=now,
            first_step_seen=self.clock.stepped,
            silent_for=self.clock.silent_for(now),
            threshold=self.clock.threshold,
            stalled=self.clock.stalled(now),
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
            ending_on_purpose=self.ending_on_purpose(),
        )

    def act(self, action: Action, now: float) -> None:
        if action.trigger in SILENCES and self.incidents.case is not None:
            # A new silence (the job moved since the first look) while another waits for its
            # second look: once that is done, this one is seen afresh, never swallowed.
            self.reported = replace(self.reported, silence=False)
            return
        silent, threshold = self.clock.silent_for(now), self.clock.threshold
        alive = f"{len(self.alive_ranks())} ranks"
        if self.others_alive():
            alive += f" and {self.others_alive()} other processes"
        if action.trigger is Trigger.NODE_SILENT:
            self.say(f"node(s) {', '.join(action.lost)} stopped answering: gathering evidence")
        elif action.trigger is Trigger.GPU_IDLE:
            self.say(
                f"every GPU idle or spinning for {self.gpus_quiet_for(now):.0f} s with no "
                f"progress: gathering stacks from {alive}"
            )
        elif action.trigger is Trigger.IN_FLIGHT:
            self.say(
                f"after {silent:.1f} s all but a few ranks wait in one {action.op} "
                f"far longer than it ever took, nothing moving data: gathering stacks from {alive}"
            )
        elif action.trigger is Trigger.SERVER_REFUSED:
            self.say(
                f"inference server(s) {', '.join(action.servers)} refuse connections: gathering "
                f"evidence from {alive}"
            )
        elif action.trigger is Trigger.SERVER_CALL:
            self.say(f"{action.awaited}: gathering evidence from {alive}")
        elif action.trigger is Trigger.IN_KERNEL:
            self.say(
                f"ranks blocked in a file operation for {self.in_kernel_for(now):.0f} s with "
                f"nothing moving: gathering evidence from {alive}"
            )
        elif action.trigger is Trigger.STALL:
            self.say(
                f"no progress for {silent:.1f} s (threshold {threshold:g} s): stall, "
                f"gathering stacks from {alive}"
            )
        elif action.say is Say.SUSPECTED:
            self.say(f"no new step for {silent:.0f} s (threshold {threshold:g} s): stall suspected")
        if action.trigger is not None:
            self.incidents.open(action.trigger, self.statuses, action.lost)
        if action.say is Say.FINISHED:
            self.finish()

    def server_awaited(self) -> str:
        """The furthest past its limit of the servers keeping a call waiting, by this node's
        sensor or a peer's published one, said as a phrase; "" when none is."""
        found = [self.server_calls.awaited] if self.server_calls.awaited else []
        for node, status in self.statuses.items():
            peer = AwaitedServer.from_dict(status.get("server_awaited"))
            if node != self.node and peer is not None:
                found.append(peer)
        return max(found, key=lambda a: a.past).phrase() if found else ""

    def in_flight_over(self, now: float) -> tuple[float, str]:
        """The sensor's readings of every node (this one's, and those the peers published). No
        peer status is parsed while this node's own ranks went unread: they are never covered."""
        if self.in_flight.reading is None and self.watch.live:
            return float("-inf"), ""
        readings = [self.in_flight.reading] if self.in_flight.reading else []
        for node, status in self.statuses.items():
            published = status.get("in_flight")
            if node != self.node and published and (peer := Reading.from_dict(published)):
                readings.append(peer)
        longest = self.clock.max_interval
        return stuck_for(
            readings, self.info.world_size, now, lambda op: self.in_flight.limit(op, longest)
        )

    def servers_refusing(self) -> tuple[str, ...]:
        """The job's inference servers, on every node, that answered once and refuse
        connections now; none once the job tears down (its servers are stopped then)."""
        if self.clock.tearing_down:
            return ()
        found = set(self.watch.servers_refusing())
        for node, status in self.statuses.items():
            if node != self.node:
                found |= {str(a) for a in status.get("servers_refusing") or []}
        return tuple(sorted(found))

    def in_kernel_for(self, now: float) -> float:
        """How long the longest-blocked rank of the job, on any node, has been blocked in the
        kernel (D, or asleep in a file operation) with
        nothing moving (0: none is)."""
        since = list(self.watch.in_kernel_since().values())
        for node, status in self.statuses.items():
            if node != self.node:
                since += [float(t) for t in (status.get("ranks_in_kernel_since") or {}).values()
                          if isinstance(t, (int, float))]  # fmt: skip
        return now - min(since) if since else 0.0

    def gpus_quiet_for(self, now: float) -> float:
        """How long every GPU of the job, on every node that has GPUs, has done no work."""
        since = []
        if self.watch.gpus.last:
            since.append(self.watch.gpus.quiet_since)
        for node, status in self.statuses.items():
            if node != self.node and status.get("gpus"):
                since.append(status.get("gpu_quiet_since"))
        if not since or any(s is None for s in since):
            return 0.0
        return now - max(since)

    def alive_ranks(self) -> set[int]:
        ranks = set(self.watch.live)
        for node, status in self.statuses.items():
            if node != self.node:
                ranks |= {int(r) for r in status.get("ranks_alive", {})}
        return ranks

    def others_alive(self) -> int:
        """Live processes of the job that are not ranks, on every node."""
        count = len(self.watch.workers)
        for node, status in self.statuses.items():
            if node != self.node:
                count += len(status.get("workers_alive", []))
        return count

    def finished_ranks(self) -> set[int]:
        """The gone ranks, on every node, whose own exit record says they returned cleanly."""
        ranks = self.watch.finished_ranks()
        for node, status in self.statuses.items():
            if node != self.node:
                ranks |= set(status.get("ranks_done", []))
        return ranks

    def gone_ranks(self) -> set[int]:
        ranks = set(self.watch.gone)
        for node, status in self.statuses.items():
            if node != self.node:
                ranks |= set(status.get("ranks_gone", []))
        return ranks
