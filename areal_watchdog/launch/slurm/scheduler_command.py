"""What a sidecar asks of Slurm, where no launcher can be asked: the backend records this
module as ``LaunchInfo.scheduler_command`` and ``watch.cluster.scheduler`` runs it with a verb. The
sidecar knows no scheduler; every Slurm name it needs is read here.

- ``where RUN_DIR``: this node's name, the job's nodes and the job id, as one JSON line;
- ``end-job RUN_DIR JOB_ID ACTION``: end a hung job (``scancel``; with ``on_hang: resume`` and
  ``resume.allocation: same`` only its steps, so the batch script keeps the allocation);
- ``orphaned RUN_DIR``: areal-launch is gone: cancel AReaL's Slurm jobs of the run.

Each prints one line for the sidecar's log.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

from areal_watchdog.common.errors import UserError
from areal_watchdog.config.model import HangAction
from areal_watchdog.launch.slurm.control.jobs import (
    cancel_jobs,
    checked_job_id,
    expand_nodelist,
    job_steps,
)
from areal_watchdog.launch.slurm.control.jobs import slurm as run_slurm
from areal_watchdog.rundir.launch_info import LaunchInfo

MODULE = "areal_watchdog.launch.slurm.scheduler_command"


def scheduler_command(python: str) -> list[str]:
    """The command a sidecar runs (on the job's nodes, with their Python)."""
    return [python, "-m", MODULE]


def where() -> dict[str, object]:
    """Where this sidecar runs, as Slurm's task environment says."""
    return {
        "node": os.environ["SLURMD_NODENAME"],
        "nodes": expand_nodelist(os.environ["SLURM_JOB_NODELIST"]),
        "job_id": os.environ.get("SLURM_JOB_ID"),
    }


def end_job(info: LaunchInfo, job_id: str, action: HangAction) -> str:
    """``scancel`` what ends this attempt; the line says what."""
    targets = [checked_job_id(job_id)]
    if action is HangAction.RESUME and info.watchdog.resume.allocation == "same":
        with contextlib.suppress(OSError, UserError):  # not listed: the whole job ends
            targets = job_steps(job_id) or targets
    out = run_slurm(["scancel", *targets])
    failed = f" (failed: {out.stderr.strip()})" if out.returncode else ""
    return f"scancel {' '.join(targets)}{failed}"


def end_orphans(info: LaunchInfo) -> str:
    """Cancel AReaL's jobs of the run (named ``<experiment>_<trial>:<role>``), if it has any."""
    if not info.dynamic_nodes:
        return ""
    cancelled = cancel_jobs(f"{info.experiment_name}_{info.trial_name}:")
    return f"cancelled AReaL's Slurm jobs {', '.join(cancelled)}" if cancelled else ""


def main(argv: list[str]) -> int:
    verb, run_dir, *rest = argv
    try:
        if verb == "where":
            print(json.dumps(where()))
            return 0
        info = LaunchInfo.load(Path(run_dir))
        if verb == "end-job":
            print(end_job(info, rest[0], HangAction(rest[1])))
        elif verb == "orphaned":
            print(end_orphans(info))
        else:
            raise UserError(f"unknown verb {verb!r} (where, end-job, orphaned)")
    except (UserError, KeyError, ValueError, IndexError) as exc:
        print(f"cannot: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
