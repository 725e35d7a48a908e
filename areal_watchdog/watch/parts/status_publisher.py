"""What a sidecar publishes about its node each poll (``status/<node>.json``, which the leader
and ``areal-launch status`` read) and when it last did: a part of the sidecar, handed what it
reads (``shared``)."""

from __future__ import annotations

import time
from typing import Any

from areal_watchdog.rundir.progress.pace import Pace
from areal_watchdog.watch.parts.shared import Collaborators, JobView


class StatusPublisher:
    """The node status: the clock, the processes, the GPUs, the open look."""

    def __init__(self, kit: Collaborators, view: JobView) -> None:
        self.kit, self.view = kit, view
        self.published: dict[str, Any] = {}  # what peers act on, as last published
        self.status_written_at: float | None = None  # when the status file was last written

    def publish(self, state: str) -> None:
        """Our status: when due, or at once when what peers act on changed."""
        status = self.status(state)
        news = {k: status[k] for k in ("state", "ranks_gone", "last_incident")}
        news["look"] = status["pace"]["look"]  # a look opened or decided: status says it now
        try:
            if self.kit.coordinator.publish(status, force=news != self.published):
                self.published, self.status_written_at = news, time.time()
        except OSError as exc:  # a full disk: peers miss one status, the watching goes on
            self.kit.log(f"cannot publish the node status: {exc}")

    def status(self, state: str) -> dict[str, Any]:
        kit, view = self.kit, self.view
        written = kit.incidents.written
        return {
            "state": state,
            "returncode": (view.own_exit or {}).get("returncode"),
            "last_step": kit.clock.last_step,
            "last_progress_at": kit.clock.last_progress_at,
            "total_steps": kit.clock.total,
            "local_step": view.beats.max_step,
            "pause_until": view.beats.pause_until,
            "pause_reason": view.beats.pause_reason,
            "leader": kit.coordinator.leader(),
            "gpus": len(kit.watch.gpus.last),
            "gpu_quiet_since": kit.watch.gpus.quiet_since,
            "job_id": kit.job_id,
            "last_incident": str(written[-1]) if written else None,
            "pace": self.pace().to_dict(),
            "in_flight": reading.to_dict() if (reading := kit.in_flight.reading) else None,
            "server_awaited": awaited.to_dict() if (awaited := kit.server_calls.awaited) else None,
            **kit.watch.summary(),
        }

    def pace(self) -> Pace:
        """The job's pace for ``status`` ("slow or hung?"): the clock, the GPUs, the open look."""
        clock, gpus = self.kit.clock, self.kit.watch.gpus
        escalation = self.kit.incidents.escalation
        look, look_state = escalation.open_look()
        stats = clock.stats
        return Pace(
            clock.last_step, clock.last_progress_at, clock.threshold, clock.learned,
            int(stats["intervals"] or 0), stats["median"], stats["p99"], stats["longest"],
            gpus=len(gpus.last),
            gpus_working=sum(gpus.state(g) == "working" for g in gpus.last),
            look=look, look_state=look_state, hard_limit=escalation.cancel_after(),
        )  # fmt: skip
