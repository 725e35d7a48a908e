"""The sidecar's request to end a hung job (``on_hang: cancel`` or ``resume``): the one record
that the local launcher, the Ray driver, a Slurm batch script and the scheduler's own cancel
read, as nvidia-resiliency-ext's ``WorkloadControlRequest`` is.

It is written to ``watchdog/cancelled.json`` before anything ends. A full disk loses the record,
not the cancel: a local launcher also hears the request at once through the pipe it gave its
sidecar (``ENV_CANCEL_FD``), as the same JSON on one line. Who then ends the job: the local
launcher (its pipe), the Ray driver (it polls the record), or where a scheduler runs the job,
the command its backend recorded at launch (``LaunchInfo.scheduler_command``, run by
``watch.cluster.scheduler``).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import Any

from areal_watchdog.common.atomic import read_json, write_json_atomic
from areal_watchdog.config.model import HangAction
from areal_watchdog.rundir.layout import ENV_CANCEL_FD, RunLayout


@dataclass(frozen=True)
class HangRequest:
    """End the job after incident ``incident_id``; ``action`` says whether the launcher then
    resumes it."""

    run_id: str
    incident_id: str
    action: HangAction
    time: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", HangAction(self.action))

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "incident_id": self.incident_id,
            "action": self.action.value,
            "time": self.time,
        }

    @classmethod
    def from_dict(cls, data: object) -> HangRequest | None:
        """The request ``data`` holds; None when it holds none (a torn or foreign file)."""
        if not isinstance(data, dict):
            return None
        try:
            return cls(
                str(data["run_id"]),
                str(data["incident_id"]),
                HangAction(data.get("action", HangAction.CANCEL)),
                float(data["time"]),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def write(self, layout: RunLayout) -> None:
        """Record it (raises OSError: the caller ends the job anyway)."""
        write_json_atomic(layout.cancel_file, self.to_dict())

    @classmethod
    def read(cls, layout: RunLayout) -> HangRequest | None:
        """The run's request, if a sidecar made one."""
        return cls.from_dict(read_json(layout.cancel_file))

    def send_to_launcher(self) -> bool:
        """One line to the local launcher through the pipe it gave this sidecar; False when
        there is none (a Slurm or Ray sidecar)."""
        fd = os.environ.get(ENV_CANCEL_FD, "")
        if not fd.isdigit():
            return False
        with contextlib.suppress(OSError):
            os.write(int(fd), (json.dumps(self.to_dict()) + "\n").encode())
        return True

    @classmethod
    def heard(cls, said: str) -> list[HangRequest]:
        """The requests in what the launcher read from its pipe (whole lines only)."""
        found = []
        for line in said.splitlines():
            with contextlib.suppress(ValueError):
                request = cls.from_dict(json.loads(line))
                if request is not None:
                    found.append(request)
        return found
