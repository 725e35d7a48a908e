"""Whether one inference server has kept a call of the job waiting far longer than the same
call took elsewhere: the rollout side's "all but a few in one collective" (issue: a weight update
that one server never answers holds the whole job, warm-up or not).

The same call is a request of the job to another server sent at about the same time (a weight
update goes to every server at once: in AReaL's single controller each rollout worker updates
its own server), and how long this server's answers to that process took before. A server that
answers any of that process's other connections is busy with it, not ignoring it (a long
generation among short ones); one that keeps the job waiting while another does too is part of
a slow phase of all of them. Pure: readings in, a finding out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from areal_watchdog.evidence.rollout_side.server_calls import ServerCall

AWAITED_MIN_S = 5.0  # a call is awaited this long at least before it is anything
AWAITED_FACTOR = 5.0  # ... and this many times what the same call took elsewhere or before
SAME_ROUND_S = 2.0  # calls of one process sent this close together are one fan-out


@dataclass(frozen=True)
class AwaitedServer:
    """A server that has not answered a process's call for ``waited`` seconds, while
    ``answered_by`` (other servers, or this one before) took at most ``usual`` seconds."""

    server: str
    pid: int
    waited: float
    usual: float
    answered_by: tuple[str, ...]
    limit: float

    @property
    def past(self) -> float:
        """Seconds past its limit (negative: not yet)."""
        return self.waited - self.limit

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "answered_by": list(self.answered_by)}

    @classmethod
    def from_dict(cls, data: object) -> AwaitedServer | None:
        """A peer's published finding; None when there is none or it is malformed."""
        try:
            return cls(str(data["server"]), int(data["pid"]), float(data["waited"]),  # type: ignore[index]
                       float(data["usual"]), tuple(map(str, data["answered_by"])),  # type: ignore[index]
                       float(data["limit"]))  # type: ignore[index]  # fmt: skip
        except (KeyError, TypeError, ValueError):
            return None

    def phrase(self) -> str:
        """``inference server 127.0.0.1:30001 has not answered pid 812's call for 9 s; 127.0.0.1:
        30000 answered the same call in 0.3 s``."""
        if self.answered_by:
            before = f"{', '.join(self.answered_by)} answered the same call in {self.usual:.1f} s"
        elif self.usual > 0:
            before = f"its answers to that process took at most {self.usual:.1f} s before"
        else:
            before = "no other server keeps the job waiting"
        return (
            f"inference server {self.server} has not answered pid {self.pid}'s call for "
            f"{self.waited:.0f} s; {before}"
        )


def awaited_server(
    calls: list[ServerCall], took: dict[tuple[int, str], float]
) -> AwaitedServer | None:
    """The server furthest past its limit (``AWAITED_MIN_S``, ``AWAITED_FACTOR`` times the
    usual), if any; ``took``: the longest each process's answers from each server took, seen
    before. A server is not singled out while another keeps the job waiting about as long
    (every server slow at once is one slow phase, a large model loading)."""
    held = [c for c in calls if c.awaiting and not _heard_since(c, calls)]
    best: AwaitedServer | None = None
    for call in held:
        if any(o.server != call.server and o.sent_ago * AWAITED_FACTOR >= call.sent_ago
               for o in held):  # fmt: skip
            continue
        found = _against_usual(call, calls, took)
        if found.waited >= found.limit and (best is None or found.past > best.past):
            best = found
    return best


def _heard_since(call: ServerCall, calls: list[ServerCall]) -> bool:
    """The same process heard from the same server since it sent this call (on another
    connection): the server works for it."""
    return any(
        c.pid == call.pid and c.server == call.server
        and c.received_ago is not None and c.received_ago < call.sent_ago
        for c in calls
    )  # fmt: skip


def _against_usual(
    call: ServerCall, calls: list[ServerCall], took: dict[tuple[int, str], float]
) -> AwaitedServer:
    """The call against what the same call took on the other servers (any process of the job
    that sent within ``SAME_ROUND_S`` of it: AReaL's controller has each rollout worker update
    its own server) and what this process's answers from this server took before."""
    peers = [
        c for c in calls
        if c.server != call.server and not c.awaiting
        and abs(c.sent_ago - call.sent_ago) <= SAME_ROUND_S
    ]  # fmt: skip
    usual = max([c.answered_in for c in peers] + [took.get((call.pid, call.server), 0.0)])
    named = tuple(sorted({c.server for c in peers}))
    limit = max(AWAITED_MIN_S, AWAITED_FACTOR * usual)
    return AwaitedServer(call.server, call.pid, call.sent_ago, usual, named, limit)
