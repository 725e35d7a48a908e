"""Arm the watchdog inside a process of a watched AReaL job: loaded by our ``sitecustomize``.

In AReaL's single-controller mode no wrapper of ours starts the workers: the controller starts
``rpc_server`` workers, they start inference servers and fork more workers. All of them inherit
the job's environment (``PYTHONPATH`` with ``rank/sitehook``, the run id), so Python itself loads
this at start-up in each, and each arms, by its role (``common.roles``):

- the cooperative stack dump to ``watchdog/procs/<pid>.stacks.txt`` and ``PR_SET_PTRACER``;
- the asyncio task listener (rollout coroutines are on no thread's stack);
- the Flight Recorder listener, in the workers whose role holds the ranks (``actor``);
- an exit record ``watchdog/procs/<pid>.exit.json`` (an uncaught exception, or an exit);
- in a Ray worker of the job (AReaL's ``RayScheduler``), all of this once Ray names the actor it
  holds (``rank.ray.ray_worker``); in a rank AReaL's Ray launcher runs as a task (SPMD), what our
  rank wrapper arms in a torchrun rank (``arm_ray_rank``);
- in the controller, the trajectory dump of AReaL's trainer (``rank.areal_hooks.areal_trajectory``)
  and, in a resumed run, the quarantined rows left out of its data
  (``rank.areal_hooks.areal_quarantine``).

Torchrun ranks are armed by our rank wrapper instead, and processes with no role of ours (a
shell, a ``multiprocessing`` helper, a tool a workflow runs) are left alone. Nothing here may
fail the process or make it wait: every step is guarded, and nothing imports torch.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import write_json_atomic
from areal_watchdog.common.roles import Identity, identify
from areal_watchdog.rank.areal_hooks import areal_quarantine, areal_trajectory
from areal_watchdog.rank.arming import (
    allow_any_tracer,
    arm_stack_dump,
    exit_record,
    quietly,
)
from areal_watchdog.rank.asyncio_tasks import task_listener
from areal_watchdog.rank.flight_recorder import ENV_FLIGHT_RECORDER, start_listener
from areal_watchdog.rank.ray import ray_worker
from areal_watchdog.rundir.layout import (
    ENV_JOB_CONFIG,
    ENV_RANK_ROLE,
    ENV_RUN_ID,
    ENV_WATCH_DIR,
    RunLayout,
)

_kept: list[Any] = []  # the open stack file: faulthandler writes to its descriptor


def own_argv() -> list[str]:
    """This process's whole command line (``sys.argv`` is not complete yet while ``site``
    runs)."""
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return [sys.executable, *sys.argv]


def install() -> Identity | None:
    """Arm this process if it is a part of the watched job; its identity, or None."""
    watch_dir = os.environ.get(ENV_WATCH_DIR)
    if not os.environ.get(ENV_RUN_ID) or not watch_dir:
        return None
    argv, env = own_argv(), dict(os.environ)
    who = identify(argv, env, env.get(ENV_JOB_CONFIG, ""))
    layout = RunLayout(Path(watch_dir).parent)
    on_ray = ray_worker.is_ray_worker(argv, env)
    if who is None and on_ray:
        pid = os.getpid()
        ray_worker.watch_for_role(
            layout.process_role_record(pid), env[ENV_RUN_ID], lambda w: arm(layout, w, pid)
        )
        return None
    if who is not None and who.role == "rank" and on_ray:
        arm_ray_rank(layout, who.index or 0)
        return who
    if who is None or who.role in ("rank", "torchrun"):
        return None
    arm(layout, who, os.getpid())
    return who


def arm_ray_rank(layout: RunLayout, rank: int) -> None:
    """A rank AReaL's Ray launcher runs as a task (SPMD): what our rank wrapper gives a torchrun
    rank, but the registration (its environment says who it is) and the exit record (Ray, not
    the process, ends a task)."""
    quietly(allow_any_tracer)
    quietly(lambda: _kept.append(arm_stack_dump(layout.stack_file(rank))))
    quietly(task_listener.start, layout)
    if os.environ.get(ENV_FLIGHT_RECORDER):
        quietly(start_listener, layout, rank)
    quietly(areal_trajectory.install)
    quietly(areal_quarantine.install)


def arm(layout: RunLayout, who: Identity, pid: int) -> None:
    """Everything a part of the job gets, by its role."""
    quietly(allow_any_tracer)
    quietly(lambda: _kept.append(arm_stack_dump(layout.process_stack_file(pid))))
    quietly(task_listener.start, layout)
    rank_role = os.environ.get(ENV_RANK_ROLE)
    if who.role == rank_role and who.index is not None and os.environ.get(ENV_FLIGHT_RECORDER):
        quietly(start_listener, layout, who.index)
    quietly(_record_exits, layout.process_exit_record(pid))
    if who.role == "controller":
        quietly(areal_trajectory.install)
        quietly(areal_quarantine.install)


def _record_exits(path: Path) -> None:
    """An uncaught exception in the main thread is recorded when it happens; any other end as
    an ``exit`` (code unknown here) when the interpreter stops."""
    pid = os.getpid()
    previous_hook = sys.excepthook

    def write(record: dict[str, Any]) -> None:
        if os.getpid() == pid:  # not in a forked child that inherited the hooks
            quietly(write_json_atomic, path, record)

    def on_exception(kind: type, exc: BaseException, tb: Any) -> None:
        if not issubclass(kind, KeyboardInterrupt):
            write(exit_record("exception", 1, exc))
        previous_hook(kind, exc, tb)

    def on_exit() -> None:
        if not path.exists():
            write(exit_record("exit", None))

    sys.excepthook = on_exception
    atexit.register(on_exit)
