"""A launch as plain data: the commands, environment and files, built before anything runs.

``--dry-run`` prints it; tests inspect it; the backend that built it executes the same object.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from typing import Any

from areal_watchdog.common.secrets.redact import Redactor


@dataclass(frozen=True)
class Gate:
    """Start a process only once ``count`` AReaL name_resolve entries exist in ``directory``
    (the inference servers SPMD training needs); their values, comma-separated, go into the
    process's ``env_var``. A service that dies meanwhile, or ``timeout``, fails the launch."""

    directory: str
    count: int
    timeout: float
    env_var: str

    def render(self) -> str:
        return (
            f"starts after: {self.count} entr{'y' if self.count == 1 else 'ies'} in "
            f"{self.directory} (up to {self.timeout:g} s); {self.env_var}=<their values>"
        )


@dataclass(frozen=True)
class ProcessSpec:
    """One process to start: ``argv`` with ``env`` added to the launcher's environment.

    ``kind``: ``job`` (its end is the job's end), ``service`` (started before the job, stopped
    after it: SPMD's inference servers), ``watchdog`` (the sidecar). ``log``: a file that gets
    the process's output besides the terminal."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    kind: str = "job"
    log: str | None = None
    after: Gate | None = None


@dataclass(frozen=True)
class LaunchPlan:
    """Everything a launch will do."""

    backend: str
    run_id: str
    run_dir: str
    files: dict[str, str]  # path -> content
    processes: list[ProcessSpec]
    reset_paths: list[str] = field(default_factory=list)  # stale state of an earlier launch
    notes: list[str] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)  # folders the job needs (AReaL's name_resolve)
    payload: Any = field(default=None, repr=False)  # the backend's own (Slurm: the submission)
    dir_mode: int = 0o700  # the run directory's permissions (watchdog.run_dir_mode)
    mode: str = "torchrun"  # torchrun | single_controller | spmd (launch.mode)

    def main(self) -> ProcessSpec:
        """The process whose end is the job's end."""
        return next(p for p in self.processes if p.kind == "job")

    def of_kind(self, kind: str) -> list[ProcessSpec]:
        return [p for p in self.processes if p.kind == kind]

    def render(self, redactor: Redactor | None = None) -> str:
        """The human-readable plan that ``--dry-run`` prints (secrets redacted)."""
        if redactor is None:  # the job's own secret-looking variables (launch.env) too
            env = {k: v for proc in self.processes for k, v in proc.env.items()}
            redactor = Redactor.from_environment({**os.environ, **env})
        lines = [
            f"backend:   {self.backend}",
            f"mode:      {self.mode}",
            f"run id:    {self.run_id}",
            f"run dir:   {self.run_dir}",
            "",
        ]
        for proc in self.processes:
            lines.append(f"process `{proc.name}` ({proc.kind}):")
            lines.append(f"  command: {shlex.join(proc.argv)}")
            if proc.cwd:
                lines.append(f"  cwd:     {proc.cwd}")
            if proc.log:
                lines.append(f"  output:  {proc.log}")
            if proc.after:
                lines.append(f"  {proc.after.render()}")
            if proc.env:
                lines.append("  environment:")
                lines.extend(f"    {k}={v}" for k, v in sorted(proc.env.items()))
            lines.append("")
        lines.append("files to write:")
        lines.extend(f"  {path} ({len(content)} bytes)" for path, content in self.files.items())
        if self.dirs:
            lines.append("directories to create:")
            lines.extend(f"  {path}" for path in self.dirs)
        if self.reset_paths:
            lines.append("stale state to remove first:")
            lines.extend(f"  {path}" for path in self.reset_paths)
        if self.notes:
            lines.append("")
            lines.extend(self.notes)
        return redactor.scrub("\n".join(lines))
