"""The thin wrapper torchrun starts on every rank: ``python -m areal_watchdog.rank.main ENTRY ...``.

It runs the user's entrypoint unchanged (a ``.py`` file or a module) in this process, after
preparing what the watchdog needs from inside the rank:

- a registration file (rank, pid, node) so the sidecar finds the rank even when it may not read
  the process's environment;
- the cooperative stack dump: ``faulthandler`` registered on SIGURG (ignored by default, so a
  stray signal never kills anything) writing every thread's stack to a per-rank file; it needs
  no ptrace and answers while the main thread is blocked inside a collective;
- ``prctl(PR_SET_PTRACER, ANY)`` so a sidecar that is not our ancestor may attach under Yama;
- an exit record (returned, exit code, or exception with its traceback) for crash analysis;
- the Flight Recorder listener (``rank.flight_recorder``) when the launcher asked for it;
- the asyncio task listener (``rank.asyncio_tasks.task_listener``): pending coroutines are on no
  thread's stack;
- the trajectory dump of AReaL's trainer (``rank.areal_hooks.areal_trajectory``), should the script
  run one, and a resumed run's quarantine (``rank.areal_hooks.areal_quarantine``);
- ``sys.stdout`` and ``sys.stderr`` masked (``common.secrets.mask``): the secrets the launcher knows
  never reach torchrun's per-rank logs through the job's own prints.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import socket
import sys
import time
from pathlib import Path

from areal_watchdog.common.atomic import write_json_atomic
from areal_watchdog.common.secrets.mask import MaskedStream
from areal_watchdog.rank.areal_hooks import areal_quarantine, areal_trajectory
from areal_watchdog.rank.arming import (
    allow_any_tracer,
    arm_stack_dump,
    exit_code,
    exit_record,
    quietly,
)
from areal_watchdog.rank.asyncio_tasks import task_listener
from areal_watchdog.rank.flight_recorder import ENV_FLIGHT_RECORDER, start_listener
from areal_watchdog.rundir.job_mask import job_mask
from areal_watchdog.rundir.layout import (
    COOPERATIVE_SIGNAL,
    ENV_RUN_ID,
    ENV_WATCH_DIR,
    RunLayout,
    node_of,
)


def _register(layout: RunLayout, rank: int) -> object | None:
    """Write the registration file and arm the cooperative dump; return the open stack file."""
    stack_file = arm_stack_dump(layout.stack_file(rank))
    node = node_of(os.environ, socket.gethostname())
    record = {
        "run_id": os.environ.get(ENV_RUN_ID, ""),
        "rank": rank,
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "node": node,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "started_at": time.time(),
        "cooperative_signal": int(COOPERATIVE_SIGNAL) if stack_file else None,
    }
    with contextlib.suppress(OSError):
        layout.registrations(node).mkdir(mode=0o700, parents=True, exist_ok=True)
        write_json_atomic(layout.registration(rank, node), record)
    return stack_file


def _record_exit(layout: RunLayout, rank: int, record: dict[str, object]) -> None:
    with contextlib.suppress(OSError):
        write_json_atomic(layout.exit_record(rank), {"rank": rank, **record})


def _mask_output(layout: RunLayout) -> None:
    """Mask the run's secrets in whatever the job prints."""
    mask = job_mask(layout)
    if mask.values:
        sys.stdout = MaskedStream(sys.stdout, mask)  # type: ignore[assignment]
        sys.stderr = MaskedStream(sys.stderr, mask)  # type: ignore[assignment]


def _run_entrypoint(entry: str, args: list[str]) -> None:
    if entry.endswith(".py") or os.sep in entry:
        path = os.path.abspath(entry)
        sys.argv = [path, *args]
        sys.path[0] = os.path.dirname(path)
        runpy.run_path(path, run_name="__main__")
    else:
        sys.argv = [entry, *args]
        runpy.run_module(entry, run_name="__main__", alter_sys=True)


def main(argv: list[str] | None = None) -> None:
    """Run ``argv[0]`` (script or module) with ``argv[1:]`` as its arguments, watched."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        sys.exit("usage: python -m areal_watchdog.rank.main ENTRYPOINT [ARGS...]")
    entry, args = argv[0], argv[1:]
    watch_dir = os.environ.get(ENV_WATCH_DIR)
    rank = int(os.environ.get("RANK", "0"))
    layout = RunLayout(Path(watch_dir).parent) if watch_dir else None
    if layout is not None:
        quietly(_mask_output, layout)
        allow_any_tracer()
        _register(layout, rank)
        if os.environ.get(ENV_FLIGHT_RECORDER) == "1":
            start_listener(layout, rank)
        task_listener.start(layout)
        quietly(areal_trajectory.install)
        quietly(areal_quarantine.install)
    try:
        _run_entrypoint(entry, args)
    except SystemExit as exc:
        if layout is not None:
            _record_exit(layout, rank, exit_record("exit", exit_code(exc.code)))
        raise
    except BaseException as exc:
        if layout is not None:
            _record_exit(layout, rank, exit_record("exception", 1, exc))
        raise
    if layout is not None:
        _record_exit(layout, rank, exit_record("returned", 0))


if __name__ == "__main__":
    main()
