"""What a sidecar left to finish after the job ended: the timelines still to draw and the
notifications still to send, handed to a detached process (``watch/timelines/late_finish.py``) so
that neither a picture nor a slow channel holds the launcher, and with it the allocation.

One record per node, written by the sidecar when it hands the work over and by the late finish
as it goes; ``areal-launch status`` reads it. The late finish is bounded by ``deadline``: a
record whose deadline passed without an end was stopped (what it had not sent stays in the
spool, retried by any later ``areal-launch`` command on the run).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace

from areal_watchdog.common.atomic import read_json, write_json_atomic
from areal_watchdog.rundir.layout import RunLayout


@dataclass(frozen=True)
class LateFinish:
    """Node ``node``'s late finish (process ``pid``), waiting for ``waiting_for`` until at
    most ``deadline``; ``ended`` and ``outcome`` once it is over."""

    run_id: str
    node: str
    pid: int
    started: float
    deadline: float
    waiting_for: tuple[str, ...]
    ended: float | None = None
    outcome: str = ""

    def running(self, now: float | None = None) -> bool:
        """Not ended, and not past its deadline (a late finish killed outright never ends)."""
        return self.ended is None and (now or time.time()) < self.deadline

    def progressed(self, waiting_for: tuple[str, ...]) -> LateFinish:
        return replace(self, waiting_for=waiting_for)

    def over(self, outcome: str) -> LateFinish:
        return replace(self, ended=time.time(), outcome=outcome, waiting_for=())

    def line(self, now: float) -> str:
        """What ``areal-launch status`` says of it."""
        where = f"late finish on {self.node} (pid {self.pid})"
        if self.ended is not None:
            return f"  {where}: {self.outcome}, {now - self.ended:.0f} s ago"
        if not self.running(now):
            return f"  {where}: stopped at its limit; what was not sent stays in the spool"
        waits = "; ".join(self.waiting_for) or "finishing"
        return f"  {where}: {waits}; gives up in {self.deadline - now:.0f} s"

    def write(self, layout: RunLayout) -> None:
        """Record it (raises OSError)."""
        layout.late_finish_dir.mkdir(exist_ok=True)
        data = {**asdict(self), "waiting_for": list(self.waiting_for)}
        write_json_atomic(layout.late_finish(self.node), data)

    @classmethod
    def from_dict(cls, data: object) -> LateFinish | None:
        """The record ``data`` holds; None for a torn or foreign file."""
        if not isinstance(data, dict):
            return None
        try:
            ended = data.get("ended")
            return cls(
                str(data["run_id"]), str(data["node"]), int(data["pid"]),
                float(data["started"]), float(data["deadline"]),
                tuple(str(w) for w in data.get("waiting_for") or ()),
                None if ended is None else float(ended), str(data.get("outcome", "")),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError):
            return None

    @classmethod
    def read_all(cls, layout: RunLayout, run_id: str | None = None) -> list[LateFinish]:
        """Every node's record (of ``run_id``, when given), by node."""
        found = []
        for path in sorted(layout.late_finish_dir.glob("*.json")):
            record = cls.from_dict(read_json(path))
            if record is not None and run_id in (None, record.run_id):
                found.append(record)
        return found
