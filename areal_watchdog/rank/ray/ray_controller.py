"""AReaL's training script as the single controller of a Ray job: ``ray.init()``, then the
script, unchanged, as ``__main__``.

AReaL's ``RayScheduler`` (``scheduler.type: ray``, 1.0.4 and 2.0.0) creates its placement groups
and ``RayRPCServer`` actors through the process's Ray connection, but AReaL's training scripts
never connect (only ``name_resolve.type: ray`` would, and the watchdog reads name_resolve from
the shared filesystem). The Jobs API gives the entrypoint ``RAY_ADDRESS``, so ``ray.init()``
joins the job's own cluster as its driver.

``AREAL_WATCHDOG_RAY_WORKER_STARTUP`` (seconds), when set, is how long AReaL's ``RayScheduler``
waits for its workers to start (AReaL's own default, 30 s, is not configurable; CI's loaded
machine once took longer to start an ``eval-rollout`` worker, and the job failed).

``python -m areal_watchdog.rank.ray.ray_controller train.py ARGS...``
"""

from __future__ import annotations

import functools
import os
import runpy
import sys

ENV_WORKER_STARTUP = "AREAL_WATCHDOG_RAY_WORKER_STARTUP"


def widen_worker_startup(seconds: str) -> None:
    """AReaL's ``RayScheduler`` waits ``seconds`` for its workers instead of its fixed 30 s."""
    try:
        wait = float(seconds)
        from areal.infra.scheduler.ray import RayScheduler
    except (ValueError, ImportError) as exc:
        print(f"[areal-watchdog] {ENV_WORKER_STARTUP} ignored: {exc}", file=sys.stderr)
        return
    original = RayScheduler.__init__

    @functools.wraps(original)
    def init(self: RayScheduler, *args: object, **kwargs: object) -> None:
        if not args:  # AReaL's trainers pass only exp_config: an explicit wait is kept
            kwargs.setdefault("startup_timeout", wait)
        original(self, *args, **kwargs)

    RayScheduler.__init__ = init  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    """Connect, then run the script with its own ``sys.argv``; its exit is ours."""
    if not argv:
        sys.exit("usage: python -m areal_watchdog.rank.ray.ray_controller SCRIPT [ARGS...]")
    import ray

    ray.init()
    if os.environ.get(ENV_WORKER_STARTUP):
        widen_worker_startup(os.environ[ENV_WORKER_STARTUP])
    sys.argv = list(argv)
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))  # as `python SCRIPT` has it
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
