"""How a sidecar acts on the scheduler that runs its job, where no launcher can be asked (a
Slurm job whose submitting shell is gone): it runs the command the backend recorded at launch
(``LaunchInfo.scheduler_command``) with a verb, and says the line it printed. The sidecar
itself knows no scheduler; the verbs are the backend module's (Slurm:
``launch.slurm.scheduler_command``).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass

from areal_watchdog.config.model import HangAction
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.watch.progress.step_log import trusted_log_problem

SCHEDULER_TIMEOUT = 60.0  # seconds for one scheduler command (a busy slurmctld answers slowly)


@dataclass(frozen=True)
class Placement:
    """Where a sidecar started by the scheduler runs: its node, the job's nodes, the job."""

    node: str
    nodes: list[str]
    job_id: str | None


def placement(info: LaunchInfo) -> Placement:
    """Asked of the scheduler once, at start; raises RuntimeError with its words."""
    said = _run(info, ["where", info.run_dir])
    try:
        found = json.loads(said)
        return Placement(str(found["node"]), [str(n) for n in found["nodes"]], found["job_id"])
    except (ValueError, KeyError, TypeError):
        raise RuntimeError(f"the scheduler did not say where this sidecar runs: {said}") from None


def end_job(info: LaunchInfo, job_id: str, action: HangAction) -> str:
    """End the hung job through the scheduler; the line says what was done."""
    return _run(info, ["end-job", info.run_dir, job_id, action.value])


def end_orphans(info: LaunchInfo) -> str:
    """End what the scheduler still runs for the run once its launcher is gone."""
    return _run(info, ["orphaned", info.run_dir]) if info.scheduler_command else ""


def _run(info: LaunchInfo, args: list[str]) -> str:
    if not info.scheduler_command:
        raise RuntimeError("this launch recorded no scheduler command")
    # the launcher wrote it 0600 in a run directory nobody else writes; anything else, not run
    refused = trusted_log_problem(info.layout.launch_file, os.getuid())
    if refused:
        return f"{args[0]} refused: {info.layout.launch_file} is not this user's alone ({refused})"
    try:
        out = subprocess.run(
            [*info.scheduler_command, *args],
            capture_output=True,
            text=True,
            timeout=SCHEDULER_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{args[0]} failed: {exc}"
    lines = (out.stdout.strip() or out.stderr.strip()).splitlines()
    return lines[-1] if lines else ""
