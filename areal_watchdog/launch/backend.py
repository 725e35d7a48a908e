"""One interface for every backend: ``plan`` builds a plain LaunchPlan (``--dry-run`` prints
it), ``execute`` runs that same object. As in torchx's ``schedule(submit_dryrun(...))``, what
the user reviews is exactly what runs."""

from __future__ import annotations

from typing import Protocol, TextIO

from areal_watchdog.config.model import JobConfig
from areal_watchdog.launch.plan import LaunchPlan


class Backend(Protocol):
    """A place to run a job: this machine, a Slurm cluster, ..."""

    name: str
    allocation: str | None  # Slurm: the job whose allocation a resume runs in (allocation: same)

    def plan(self, config: JobConfig, watchdog: bool, run_id: str | None = None) -> LaunchPlan:
        """Everything the launch will do; raises ConfigError before anything exists."""
        ...

    def execute(self, plan: LaunchPlan, out: TextIO) -> int:
        """Run the plan; return areal-launch's exit code."""
        ...

    def release(self) -> None:
        """Give back what a resume would have run in (a kept Slurm allocation)."""
        ...


def backend(name: str, wait: bool = False) -> Backend:
    """The backend called ``name`` (``local``, ``slurm`` or ``ray``; ``wait``: follow a
    submitted job)."""
    if name == "ray":
        from areal_watchdog.launch.ray.backend import RayBackend

        return RayBackend()
    if name == "slurm":
        from areal_watchdog.launch.slurm.backend import SlurmBackend

        return SlurmBackend(wait)
    from areal_watchdog.launch.local import LocalBackend

    return LocalBackend()
