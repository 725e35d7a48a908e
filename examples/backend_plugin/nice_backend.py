"""A fourth backend in one file: the local launch, its job at a lower CPU priority."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import TextIO

from areal_watchdog.config.model import JobConfig
from areal_watchdog.launch.local import LocalBackend
from areal_watchdog.launch.plan import LaunchPlan
from areal_watchdog.launch.recovery import Recovery


class NiceBackend:
    name = "nice"
    recovery = Recovery()  # resumes and replays as the local backend does

    def __init__(self, niceness: int = 10) -> None:
        self.niceness, self.local = niceness, LocalBackend()

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--niceness", type=int, default=10, help="nice's increment")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> NiceBackend:
        return cls(args.niceness)

    def plan(self, config: JobConfig, watchdog: bool, run_id: str | None = None) -> LaunchPlan:
        plan = self.local.plan(config, watchdog, run_id)
        job = plan.main()
        niced = replace(job, argv=["nice", "-n", str(self.niceness), *job.argv])
        processes = [niced if p is job else p for p in plan.processes]
        return replace(plan, backend=self.name, processes=processes)

    def execute(self, plan: LaunchPlan, out: TextIO) -> int:
        return self.local.execute(plan, out)

    def release(self) -> None:
        """Nothing kept between attempts."""
