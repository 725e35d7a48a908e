"""One interface for every backend: ``plan`` builds a plain LaunchPlan (``--dry-run`` prints
it), ``execute`` runs that same object. As in torchx's ``schedule(submit_dryrun(...))``, what
the user reviews is exactly what runs.

A backend is found by name in ``BACKENDS``, or in the ``areal_watchdog.backends`` entry points
of an installed package: a new backend is one subpackage and one registration
(docs/architecture.md). Everything else asks the backend what it can do (its ``recovery``),
never tests its name."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Protocol, TextIO

from areal_watchdog.common.errors import UserError
from areal_watchdog.common.plugins import load, registered
from areal_watchdog.config.model import JobConfig
from areal_watchdog.launch.planning.plan import LaunchPlan
from areal_watchdog.launch.recovery import Recovery
from areal_watchdog.launch.run_handle import (
    Described,
    UnrecordedRun,
    run_directory,
    split_handle,
)

ENTRY_POINTS = "areal_watchdog.backends"
BACKENDS = {  # name -> "module:class"
    "local": "areal_watchdog.launch.local:LocalBackend",
    "slurm": "areal_watchdog.launch.slurm.backend:SlurmBackend",
    "ray": "areal_watchdog.launch.ray.backend:RayBackend",
}


class Backend(Protocol):
    """A place to run a job: this machine, a Slurm cluster, ..."""

    name: str
    recovery: Recovery  # what on_hang: resume may ask of it

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Its own options of ``areal-launch NAME`` (Slurm: ``--wait``)."""
        ...

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Backend:
        """The backend for one launch, from the parsed command line."""
        ...

    def plan(self, config: JobConfig, watchdog: bool, run_id: str | None = None) -> LaunchPlan:
        """Everything the launch will do; raises ConfigError before anything exists."""
        ...

    def execute(self, plan: LaunchPlan, out: TextIO) -> int:
        """Run the plan; return areal-launch's exit code."""
        ...

    def release(self) -> None:
        """Give back what a resume would have run in (a kept Slurm allocation)."""
        ...

    @classmethod
    def recognises(cls, run_dir: Path) -> bool:
        """Whether this backend launched the run in ``run_dir`` (checked)."""
        ...

    @classmethod
    def recognises_job(cls, text: str) -> bool:
        """Whether ``text`` (no run directory) is a job id of this backend (Slurm: ``123``)."""
        ...

    @classmethod
    def describe(cls, target: str) -> Described:
        """What ``areal-launch status`` shows of a run this backend launched (its id in the
        handle: a run directory, a Slurm job id)."""
        ...

    @classmethod
    def cancel(cls, target: str) -> str:
        """End the run; the line says what was done."""
        ...


def backend_names() -> list[str]:
    """Every backend ``areal-launch`` offers: ours, then the installed packages'."""
    return registered(BACKENDS, ENTRY_POINTS)


def resolve_target(text: str) -> tuple[type[Backend], str]:
    """The backend of a run and its id there: from a handle (``slurm://123``,
    ``local://RUN_DIR``), from the run directory (the backend that recognises it, else this
    machine's: its processes carry the run's id), or a job id a backend recognises."""
    scheme, target = split_handle(text)
    if scheme is not None:
        return backend_class(scheme), target
    kinds = [backend_class(name) for name in backend_names()]
    path = Path(text)
    if not (path.is_dir() or path.is_symlink()):
        for kind in kinds:
            if kind.recognises_job(text):
                return kind, text
        raise UserError(f"{text}: neither a run directory nor a job id of a backend")
    run_dir = run_directory(text)
    for kind in kinds:
        if kind.recognises(run_dir):
            return kind, text
    return UnrecordedRun, text


def backend_class(name: str) -> type[Backend]:
    """The backend registered as ``name``."""
    found = load(name, BACKENDS, ENTRY_POINTS)
    if found is None:
        raise UserError(f"no backend named {name!r} (installed: {', '.join(backend_names())})")
    return found
