"""What a sidecar publishes about its node each poll (``status/<node>.json``, which the leader
and ``areal-launch status`` read) and when it last did: a mixin of the sidecar."""

from __future__ import annotations

import time
from typing import Any

from areal_watchdog.rundir.pace import Pace


class StatusPublisher:
    """The node status: the clock, the processes, the GPUs, the open look."""

    status_written_at: float | None = None  # when the status file was last written

    def publish(self, state: str) -> None:
        """Our status: when due, or at once when what peers act on changed."""
        status = self.status(state)
        news = {k: status[k] for k in ("state", "ranks_gone", "last_incident")}
        news["look"] = status["pace"]["look"]  # a look opened or decided: status says it now
        try:
            if self.coordinator.publish(status, force=news != self.published):
                self.published, self.status_written_at = news, time.time()
        except OSError as exc:  # a full disk: peers miss one status, the watching goes on
            self.log(f"cannot publish the node status: {exc}")

    def status(self, state: str) -> dict[str, Any]:
        written = self.incidents.written
        return {
            "state": state,
            "returncode": (self.own_exit or {}).get("returncode"),
            "last_step": self.clock.last_step,
            "last_progress_at": self.clock.last_progress_at,
            "total_steps": self.clock.total,
            "local_step": self.beats.max_step,
            "pause_until": self.beats.pause_until,
            "pause_reason": self.beats.pause_reason,
            "leader": self.coordinator.leader(),
            "gpus": len(self.watch.gpus.last),
            "gpu_quiet_since": self.watch.gpus.quiet_since,
            "job_id": self.job_id,
            "last_incident": str(written[-1]) if written else None,
            "pace": self.pace().to_dict(),
            "in_flight": self.in_flight.reading.to_dict() if self.in_flight.reading else None,
            "server_awaited": awaited.to_dict() if (awaited := self.server_calls.awaited) else None,
            **self.watch.summary(),
        }

    def pace(self) -> Pace:
        """The job's pace for ``status`` ("slow or hung?"): the clock, the GPUs, the open look."""
        clock, gpus = self.clock, self.watch.gpus
        look, look_state = self.incidents.open_look()
        return Pace(
            clock.last_step, clock.last_progress_at, clock.threshold, clock.learned,
            **clock.stats, gpus=len(gpus.last),
            gpus_working=sum(gpus.state(g) == "working" for g in gpus.last),
            look=look, look_state=look_state, hard_limit=self.incidents.cancel_after(),
        )  # fmt: skip
