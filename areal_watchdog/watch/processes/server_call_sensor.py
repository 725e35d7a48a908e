"""The rollout side's sensor between looks: while the job is silent, this node's processes'
connections to its inference servers are read each poll (``evidence.rollout_side.server_calls``),
and a server that keeps a call waiting far longer than the same call took elsewhere or before
(``diagnose.rollout_rules.server_calls``) is published in the node status, for the leader to look at
once (trigger ``server_call_awaited``), warm-up or not. The look's evidence decides, as any look's
does: the sensor costs no false alarm, only a look.

An answer seen at one poll is remembered for a while: a client that closes its connection once
answered (no keep-alive) leaves nothing in the sockets to compare the held call with."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from areal_watchdog.diagnose.rollout_rules.server_calls import AwaitedServer, awaited_server
from areal_watchdog.evidence.rollout_side.server_calls import ServerCall, read_server_calls
from areal_watchdog.watch.processes.in_flight_sensor import SENSE_AFTER_MIN
from areal_watchdog.watch.processes.node_watch import NodeWatch

ANSWERS_KEPT_S = 300.0  # how long an answer seen is remembered


@dataclass
class ServerCallSensor:
    """What this node read of its calls to the servers, and how long answers took so far."""

    # (pid, server) -> the longest answer seen: a rollout worker's generations do not set the
    # pace of its pool process's weight updates
    took: dict[tuple[int, str], float] = field(default_factory=dict)
    # (pid, server) -> (when the newest answered call was sent, how long its answer took)
    answers: dict[tuple[int, str], tuple[float, float]] = field(default_factory=dict)
    # (pid, server) -> when the call awaited at the last reading was sent
    pending: dict[tuple[int, str], float] = field(default_factory=dict)
    awaited: AwaitedServer | None = None

    def poll(self, silent_for: float | None, watch: NodeWatch) -> None:
        """Read while the job is silent (``silent_for`` None: it is not, or a look or the
        threshold has taken over) and this node knows servers."""
        servers = watch.servers()
        if silent_for is None or silent_for < SENSE_AFTER_MIN or not servers:
            self.awaited = None
            return
        now = time.time()
        calls = read_server_calls(watch.client_pids(), servers)
        self.awaited = awaited_server(calls + self.remember(now, calls), self.took)

    def learn(self, key: tuple[int, str], sent: float, took: float) -> None:
        """A call of ``key`` sent at ``sent`` was answered (or ended) ``took`` seconds later."""
        self.took[key] = max(self.took.get(key, 0.0), took)
        self.answers[key] = (sent, took)

    def ended(self, now: float, calls: list[ServerCall]) -> None:
        """A call awaited at the last reading whose connection is gone now ended (a client
        that closes its session once answered, as AReaL's weight update does): it took at most
        until now, which is what its process's next call is held against."""
        awaited = {(c.pid, c.server): now - c.sent_ago for c in calls if c.awaiting}
        for key, sent in self.pending.items():
            if abs(awaited.get(key, float("inf")) - sent) > 1.0:
                self.learn(key, sent, now - sent)
        self.pending = awaited

    def remember(self, now: float, calls: list[ServerCall]) -> list[ServerCall]:
        """Learn the answers in ``calls``; return those remembered whose connection is gone,
        as they would read now."""
        for call in calls:
            if not call.awaiting:
                self.learn((call.pid, call.server), now - call.sent_ago, call.answered_in)
        self.ended(now, calls)
        for key, (sent, _) in list(self.answers.items()):
            if now - sent > ANSWERS_KEPT_S:
                del self.answers[key]
        current = {(c.pid, c.server) for c in calls}
        return [
            ServerCall(pid, server, now - sent, now - sent - took)
            for (pid, server), (sent, took) in self.answers.items()
            if (pid, server) not in current
        ]
