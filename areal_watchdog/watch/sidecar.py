"""The watchdog sidecar: one per node, a separate process beside the job's ranks.

``python -m areal_watchdog.watch.sidecar --run-dir RUN_DIR (--node NODE | --node-from-scheduler)``

Every sidecar follows progress (step lines, heartbeats, pauses), watches its node's ranks,
publishes its node's status and answers evidence requests. The leader (``coordination``) also
decides, through the pure rules of ``triggers``, when to open an incident (``incident``): the job
stalls, a rank dies while others live on, a node falls silent, or the job fails. Signals
(SIGTERM, SIGINT, SIGHUP, submitit's SIGUSR2) mean "the job is ending", never a hang. Its own
errors are logged and survived: a dead watchdog leaves the job unwatched.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO

from areal_watchdog.common.secrets.redact import Redactor
from areal_watchdog.config.sinks import SinkSpec
from areal_watchdog.evidence.discovery import Scope
from areal_watchdog.evidence.gpu import GpuBackend, IdleTracker, NoGpu, open_backend
from areal_watchdog.notify.notifier import Notifier
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import ENV_RAYLET
from areal_watchdog.rundir.progress.history import History
from areal_watchdog.rundir.secure import run_dir_owner
from areal_watchdog.watch.cluster.coordination import Coordinator
from areal_watchdog.watch.cluster.scheduler import placement
from areal_watchdog.watch.cluster.standby import wait_for_node_lock
from areal_watchdog.watch.cluster.status_keeper import StatusKeeper
from areal_watchdog.watch.parts.job_end import JobEnd
from areal_watchdog.watch.parts.launcher_heartbeat import watch_heartbeat
from areal_watchdog.watch.parts.leader import Leader
from areal_watchdog.watch.parts.metrics_feed import start_feed
from areal_watchdog.watch.parts.progress_watch import ProgressWatch
from areal_watchdog.watch.parts.shared import Collaborators, JobView
from areal_watchdog.watch.parts.status_publisher import StatusPublisher
from areal_watchdog.watch.parts.voice import Voice
from areal_watchdog.watch.processes.in_flight_sensor import InFlightSensor
from areal_watchdog.watch.processes.node_watch import NodeWatch
from areal_watchdog.watch.processes.server_call_sensor import ServerCallSensor
from areal_watchdog.watch.progress.stall_clock import StallClock
from areal_watchdog.watch.progress.step_log import StepLogTail, default_log_patterns
from areal_watchdog.watch.silence.incident_desk import Incidents, local_evidence
from areal_watchdog.watch.timelines.timeline_drawings import Drawings

FOLLOWER_LINGER = 60.0  # seconds a finished follower keeps answering a leader that has not finished
REQUEST_LOOK, REQUEST_WINDOW = 0.3, 1.0  # seconds: a follower's looks for the request, how long


class Sidecar:
    """The watchdog loop for one node: it builds the collaborators and the parts (progress,
    status, the job's end, the leader), and polls until the job ends."""

    def __init__(
        self, info: LaunchInfo, node: str, nodes: list[str], job_id: str | None = None,
        out: IO[str] = sys.stdout,
    ) -> None:  # fmt: skip
        wd, layout = info.watchdog, info.layout
        self.info = info
        self.voice = Voice(node, layout.logs_dir, Redactor.from_environment(), out)
        say, log = self.voice.say, self.voice.log
        clock = StallClock(
            stall_timeout=wd.stall_timeout, startup_timeout=wd.startup_timeout,
            auto_factor=wd.auto_factor, auto_min_timeout=wd.auto_min_timeout,
            teardown_timeout=wd.teardown_timeout,
        )  # fmt: skip
        specs = [SinkSpec.from_dict(d) for d in wd.notify]
        notifier = Notifier(
            specs, layout.spool_dir, self.voice.redactor, log, wd.spool_retry_interval, say=say,
            incidents_dir=layout.incidents_dir,
        )  # fmt: skip
        self.voice.redactor = notifier.redactor
        scope = Scope(
            info.run_id, node, info.world_size, info.rank_role, str(layout.job_config),
            os.environ.get(ENV_RAYLET) or None,
        )  # fmt: skip
        watch = NodeWatch(
            layout, scope, info.nproc_per_node, log, gpu_backend=self.open_gpus(),
            gpus=IdleTracker(wd.gpu.idle_utilization, wd.gpu.spin_power_fraction),
        )  # fmt: skip
        coordinator = Coordinator(
            layout, info.run_id, node, nodes, wd.node_timeout, dynamic=info.dynamic_nodes
        )
        incidents = Incidents(
            info, node, nodes, job_id, watch, coordinator, clock, notifier, say,
            history=History(node), drawings=Drawings(log, notifier.submit_picture),
        )  # fmt: skip
        self.kit = Collaborators(
            info, node, nodes, job_id, clock, watch, coordinator, incidents, notifier,
            InFlightSensor(layout), ServerCallSensor(), say, log,
        )  # fmt: skip
        self.view = JobView()
        patterns = default_log_patterns(layout, info, nodes[0])
        owner = run_dir_owner(layout.run_dir)  # the job's user: its logs alone count
        tail = StepLogTail(patterns + list(wd.log_files), wd.step_regex, owner)
        self.progress = ProgressWatch(self.kit, self.view, tail)
        self.publisher = StatusPublisher(self.kit, self.view)
        self.job_end = JobEnd(self.kit, self.view, self.publisher)
        self.leader = Leader(self.kit, self.view, self.job_end)
        self.answered_progress: float | None = -1.0  # the stall we answered for: its progress
        self.run_dir_lost = False
        self.metrics = start_feed(info, node, log)

    def open_gpus(self) -> GpuBackend:
        wd = self.info.watchdog
        try:
            backend = open_backend(wd.gpu.backend, wd.gpu.recording)
        except Exception as exc:  # noqa: BLE001 - explain, then watch without GPUs
            self.voice.say(
                f"GPU monitor {wd.gpu.backend} unavailable ({exc}); watching without GPUs"
            )
            return NoGpu()
        self.voice.log(f"GPU monitor: {backend.name}")
        return backend

    # ------------------------------------------------------------------- loop
    def run(self) -> int:
        """Watch until the job ends (or a signal says it is ending); return 0."""
        wd, kit, view = self.info.watchdog, self.kit, self.view
        threshold = "auto" if wd.stall_timeout is None else f"{wd.stall_timeout:g} s"
        shape = f"{self.info.world_size} ranks"
        if self.info.mode != "torchrun":  # AReaL's modes: the other processes are watched too
            shape = f"AReaL {self.info.mode}, {shape} and every other process of the job"
        kit.say(
            f"watching run {self.info.run_id}: {shape} on {len(kit.nodes)} node(s), stall "
            f"after {threshold} (startup {wd.startup_timeout:g} s)"
        )
        with StatusKeeper(kit.coordinator) as keeper:  # a long step never looks like a loss
            while not view.done and not view.stopping:
                started = time.perf_counter()
                with keeper.step():
                    self.guarded(self.poll, time.time())
                self.guarded(self.measured, time.perf_counter() - started)
                if view.done:
                    break
                time.sleep(self.pause(wd.poll_interval))
            if view.stopping and not view.done:
                with keeper.step():
                    self.guarded(lambda _now: self.job_end.on_job_ending(), time.time())
        if self.metrics is not None:
            self.metrics.close()
        self.job_end.wind_down()
        return 0

    def measured(self, poll_seconds: float) -> None:
        """The metrics after a poll (when ``watchdog.metrics`` asks for them)."""
        if self.metrics is not None:
            written_at = self.publisher.status_written_at
            self.metrics.update(self.kit, written_at, poll_seconds, self.view.own_exit is None)

    def reads_leader_closely(self, now: float) -> bool:
        """Whether a follower reads the leader's status every poll, else when due: from a poll
        before the stall threshold until it answered for this stall (the evidence request comes
        then; a second look's comes later, on purpose), while ranks run here (after the end,
        that was a read a second for nothing)."""
        clock = self.kit.clock
        crossing = now >= clock.crossed_at() - self.info.watchdog.poll_interval
        answered = self.answered_progress == clock.last_progress_at
        return crossing and not answered and self.view.own_exit is None

    def pause(self, poll_interval: float) -> float:
        """Until the next poll: a poll interval, or less when the stall threshold comes first
        (the leader looks the moment it is crossed). Just after it, a follower that has not
        answered looks every ``REQUEST_LOOK`` for ``REQUEST_WINDOW``: the leader's request
        comes a moment after the threshold, and at the next poll it was seen a second late. Then
        a poll interval again: a follower polling the leader's status as fast as it can read it
        while the job hangs made some 30 reads a second on the shared filesystem."""
        now = time.time()
        until = self.kit.clock.crossed_at() - now
        if until > 0:
            return min(poll_interval, until + 0.01)
        following = not self.kit.coordinator.is_leader()
        if following and -until < REQUEST_WINDOW and self.reads_leader_closely(now):
            return min(poll_interval, REQUEST_LOOK)
        return poll_interval

    def guarded(self, step: Callable[[float], object], now: float) -> None:
        """Run one step; its failure (a full disk, a deleted file, a bug) is logged, said once
        and survived: a sidecar that dies leaves the job unwatched."""
        try:
            step(now)
        except Exception as exc:  # noqa: BLE001 - the watchdog must outlive its own errors
            self.voice.log("poll failed:\n" + traceback.format_exc())
            self.voice.say(f"watchdog error, still watching: {type(exc).__name__}: {exc}")

    def poll(self, now: float) -> None:
        """One observation; the leader may open an incident. A follower reads one file a poll
        (the leader's status); what matters less often waits until its status is due."""
        kit, view, watch, clock = self.kit, self.view, self.kit.watch, self.kit.clock
        due = kit.coordinator.due()
        judging = kit.coordinator.is_leader()  # only a leader reports: it checks each poll
        if self.run_dir_lost or (judging and not self.run_dir_present()):
            return
        kit.incidents.write_pending()
        view.statuses = kit.coordinator.refresh(closely=self.reads_leader_closely(now))
        leading = kit.coordinator.is_leader()
        self.progress.observe(now, leading, due)
        self.progress.learn_step_time()
        watch.refresh(now)
        watch.sample_gpus(now)
        self.remember(now)
        # The sensor reads a silence no look and no threshold took over yet: the leader each
        # poll, a follower when its status (which carries the reading) is due, so a follower's
        # file operations stay within its budget at 1,024 nodes (tests/test_scale_sidecars.py).
        # Not after the last step: ranks waiting in the closing barrier for rank 0's final save
        # are the teardown, a hang only after teardown_timeout.
        sensing = clock.stepped and kit.incidents.case is None and not clock.stalled(now)
        sensing = sensing and not clock.tearing_down
        sensing = sensing and (leading or due)
        silent_for = clock.silent_for(now) if sensing else None
        kit.in_flight.poll(now, silent_for, clock.stats["median"], watch)
        kit.server_calls.poll(silent_for, watch)
        self.answer_request()
        if view.own_exit is None and (leading or due) and not watch.live:
            view.own_exit = self.job_end.exit_record(kit.node)  # only while no rank runs here
        if view.own_exit is not None:
            view.exited_at = view.exited_at or time.monotonic()
            watch.all_gone()
        self.publisher.publish("exited" if view.own_exit is not None else "watching")
        if leading:
            self.leader.lead(now)
        elif view.own_exit is not None and (
            self.job_end.finished() or time.monotonic() - (view.exited_at or 0) > FOLLOWER_LINGER
        ):
            view.done = True

    def remember(self, now: float) -> None:
        """The short history a timeline is drawn from; the drawings that ended are reaped."""
        incidents, clock = self.kit.incidents, self.kit.clock
        incidents.history.note_step(clock.last_step, clock.last_progress_at)
        incidents.history.note_gpus(now, self.kit.watch.gpus.last)
        incidents.history.note_job_gpus(now, self.view.statuses.values())
        if incidents.drawings is not None:
            incidents.drawings.reap()

    def run_dir_present(self) -> bool:
        """Losing our own files (the run directory deleted) is our problem, not the job's:
        say so once, loudly, and stop judging the job instead of cancelling it."""
        layout = self.info.layout
        if layout.launch_file.exists():
            return True
        if not self.run_dir_lost:
            self.run_dir_lost = True
            self.voice.say(
                f"WARNING: the run directory {layout.run_dir} is gone: the watchdog can no "
                "longer follow this job; it will not report or cancel anything"
            )
        return False

    def answer_request(self) -> None:
        """Send this node's evidence for a request we have not answered yet."""
        kit = self.kit
        request = kit.coordinator.current_request()
        if request is None or request["id"] in kit.incidents.answered:
            return
        kit.incidents.answered.add(request["id"])
        self.answered_progress = kit.clock.last_progress_at
        if request.get("by") == kit.node:
            return  # the leader gathers its own node directly
        started = time.monotonic()
        mine = local_evidence(self.info, kit.watch, kit.clock.stepped)
        kit.coordinator.answer(request["id"], mine.to_answer())
        took, ranks = time.monotonic() - started, len(mine.ranks)
        kit.log(f"answered evidence request {request['id']} ({ranks} ranks, {took:.2f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m areal_watchdog.watch.sidecar", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--run-dir", required=True, type=Path)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--node", help="this node's name (single-node launches)")
    where.add_argument(
        "--node-from-scheduler",
        action="store_true",
        help="ask the scheduler (the launch's recorded command) for this node, the job's nodes "
        "and the job id",
    )
    parser.add_argument(
        "--ray",
        action="store_true",
        help="placed on a Ray node by the run's driver: the launcher is watched through its "
        "heartbeat file, this node's processes by their raylet",
    )
    parser.add_argument(
        "--standby",
        action="store_true",
        help="started by every task of AReaL's Slurm jobs: one sidecar per node watches (the "
        "others wait for its lock and take over when its task ends), each ends with its task",
    )
    args = parser.parse_args(argv)
    try:
        info = LaunchInfo.load(args.run_dir)
        if args.standby:
            node, nodes, job_id = placement(info).node, list(info.nodes), info.job_id
            nodes += [node] if node not in nodes else []
        elif args.node_from_scheduler:
            placed = placement(info)
            node, nodes, job_id = placed.node, placed.nodes, placed.job_id
        else:
            node, nodes, job_id = args.node, info.nodes or [args.node], info.job_id
    except Exception as exc:  # noqa: BLE001 - the sidecar must explain, not crash
        print(f"[areal-watchdog] cannot start: {exc}", file=sys.stderr)
        return 2
    if args.standby and not wait_for_node_lock(info.layout, node):
        return 0
    sidecar = Sidecar(info, node, nodes, job_id)
    launcher = os.getppid() if args.node and not args.ray else None  # areal-launch's child
    orphan = threading.Event()
    if args.ray:
        watch_heartbeat(info, sidecar.view, sidecar.voice.say, orphan)

    def _stop(signum: int, _frame: object) -> None:
        sidecar.view.stopping = True

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2):
        signal.signal(sig, _stop)
    code = sidecar.run()
    if orphan.is_set() or (launcher is not None and os.getppid() != launcher):
        sidecar.job_end.orphaned()
    return code


if __name__ == "__main__":
    sys.exit(main())
