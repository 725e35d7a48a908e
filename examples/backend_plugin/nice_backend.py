"""A fourth backend in one file: the local launch, its job at a lower CPU priority."""

from __future__ import annotations

import argparse
from dataclasses import replace

from areal_watchdog.config.model import JobConfig
from areal_watchdog.launch.local import LocalBackend
from areal_watchdog.launch.planning.plan import LaunchPlan


class NiceBackend(LocalBackend):
    """Runs, resumes, describes and cancels as the local backend does (its ``recovery``,
    ``execute``, ``describe``, ``cancel``); only the plan differs."""

    name = "nice"

    def __init__(self, niceness: int = 10) -> None:
        self.niceness = niceness

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--niceness", type=int, default=10, help="nice's increment")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> NiceBackend:
        return cls(args.niceness)

    def plan(self, config: JobConfig, watchdog: bool, run_id: str | None = None) -> LaunchPlan:
        plan = super().plan(config, watchdog, run_id)
        job = plan.main()
        niced = replace(job, argv=["nice", "-n", str(self.niceness), *job.argv])
        processes = [niced if p is job else p for p in plan.processes]
        return replace(plan, backend=self.name, processes=processes)
