"""What the sidecar's parts share, declared in one place: the collaborators the sidecar builds
once (``Collaborators``) and what its polls learn of the job (``JobView``). Each part
(``progress_watch``, ``status_publisher``, ``job_end``, ``leader``) is handed these two and
the other parts it calls, so a reader (and the lint step's type checker) sees all it reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from areal_watchdog.notify.notifier import Notifier
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.watch.cluster.coordination import Coordinator
from areal_watchdog.watch.processes.in_flight_sensor import InFlightSensor
from areal_watchdog.watch.processes.node_watch import NodeWatch
from areal_watchdog.watch.processes.server_call_sensor import ServerCallSensor
from areal_watchdog.watch.progress.heartbeats import HeartbeatState
from areal_watchdog.watch.progress.stall_clock import StallClock
from areal_watchdog.watch.silence.incident_desk import Incidents
from areal_watchdog.watch.silence.triggers import Reported


@dataclass(frozen=True)
class Collaborators:
    """The sidecar's collaborators, built once: the launch, this node, its peers, the clock,
    this node's processes and sensors, the incident desk, the notifier, its voice."""

    info: LaunchInfo
    node: str
    nodes: list[str]
    job_id: str | None
    clock: StallClock
    watch: NodeWatch
    coordinator: Coordinator
    incidents: Incidents
    notifier: Notifier
    in_flight: InFlightSensor
    server_calls: ServerCallSensor
    say: Callable[[str], None]
    log: Callable[[str], None]

    @property
    def layout(self) -> RunLayout:
        return self.info.layout


@dataclass
class JobView:
    """What the sidecar learned of the job at its last polls, changed by its parts: the peers'
    statuses, what was already reported, this node's heartbeats and exit, and whether the
    sidecar stops."""

    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    reported: Reported = field(default_factory=Reported)
    beats: HeartbeatState = field(default_factory=HeartbeatState)
    own_exit: dict[str, Any] | None = None  # this node's job_exit record, once seen
    exited_at: float | None = None  # when this sidecar first saw it (monotonic)
    stopping: bool = False  # a signal (or the launcher's silence) says the job is ending
    done: bool = False  # the sidecar's loop ends
