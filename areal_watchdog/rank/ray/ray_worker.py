"""A Ray worker process of a watched job, which may become one of AReaL's workers.

AReaL's ``RayScheduler`` (single controller on Ray) runs each worker as a ``RayRPCServer`` actor
named ``<role>/<index>`` (``actor/0``). Ray starts the process as ``default_worker.py`` before it
knows which actor it will hold, so neither the command line nor the environment says; the
actor's name, once Ray has created it, does. A thread asks Ray for it (the runtime context: no
call leaves the process) and, when the process holds a named AReaL worker, writes its role
record (``watchdog/procs/<pid>.role.json``, which the sidecar's discovery reads) and hands the
identity back to be armed like any other part of the job.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from areal_watchdog.common.atomic import write_json_atomic
from areal_watchdog.common.roles import Identity
from areal_watchdog.rank.arming import quietly

RAY_WORKER_SCRIPT = "default_worker.py"
WORKER_NAME = re.compile(r"^(?P<role>[A-Za-z][\w-]*)/(?P<index>\d+)$")  # RayScheduler's ids
POLL_S = 1.0


def is_ray_worker(argv: list[str], env: dict[str, str]) -> bool:
    """Ray's worker process (``default_worker.py``, started by a raylet)."""
    return "RAY_RAYLET_PID" in env and any(a.endswith(RAY_WORKER_SCRIPT) for a in argv[:3])


def identity_of(actor_name: str | None) -> Identity | None:
    """``actor/0`` -> role ``actor``, index 0; any other name (or none) is no AReaL worker."""
    match = WORKER_NAME.match(actor_name or "")
    return Identity(match["role"], int(match["index"])) if match else None


def watch_for_role(record: Path, run_id: str, arm: Callable[[Identity], None]) -> None:
    """Until this process holds a named AReaL worker: then record it and ``arm`` it."""

    def wait() -> None:
        while (who := identity_of(_actor_name())) is None:
            time.sleep(POLL_S)
        quietly(arm, who)  # first: the sidecar finds it armed
        quietly(_write_record, record, run_id, who)

    threading.Thread(target=wait, name="areal-watchdog-ray-role", daemon=True).start()


def _actor_name() -> str | None:
    ray = sys.modules.get("ray")  # imported by Ray's worker itself; never imported here
    if ray is None:
        return None
    try:
        return ray.get_runtime_context().get_actor_name()
    except Exception:  # noqa: BLE001 - not connected yet, or no actor
        return None


def _write_record(path: Path, run_id: str, who: Identity) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"run_id": run_id, "pid": os.getpid(), "role": who.role, "index": who.index,
              "time": time.time()}  # fmt: skip
    write_json_atomic(path, record)
