"""Follow and end a submitted Slurm job by id: state, waiting, cancelling, node statuses."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import read_json
from areal_watchdog.common.errors import UserError
from areal_watchdog.launch.exit_codes import ExitCode
from areal_watchdog.rundir.layout import RunLayout

ACTIVE_STATES = (
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED",
)  # fmt: skip


def job_state(job_id: str) -> dict[str, str]:
    """``scontrol show job``'s fields (JobState, Reason, NodeList, Comment...); empty if purged."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        return {}
    return dict(re.findall(r"(\w+)=(\S*)", out.stdout))


def resolve_job(target: str) -> tuple[str, Path | None]:
    """A run directory or a job id -> (job id, run directory if known)."""
    path = Path(target)
    if path.is_dir():
        record = read_json(RunLayout(path).watch_dir / "slurm_job.json")
        if not isinstance(record, dict):
            raise UserError(f"{target}: no Slurm job was submitted from this run directory")
        return str(record["job_id"]), path
    if not target.isdigit():
        raise UserError(f"{target}: neither a run directory nor a Slurm job id")
    comment = job_state(target).get("Comment", "")
    run_dir = Path(comment.split(":", 1)[1]) if comment.startswith("areal-watchdog:") else None
    return target, run_dir


def wait_for_job(job_id: str, run_dir: Path, poll: float = 2.0, out=print) -> int:
    """Follow a job to its end; the exit code says how it ended (see docs/cli.md)."""
    last = None
    while True:
        state = job_state(job_id).get("JobState", "UNKNOWN")
        if state != last:
            out(f"[areal-launch] job {job_id}: {state}")
            last = state
        if state not in ACTIVE_STATES:
            break
        time.sleep(poll)
    if isinstance(read_json(RunLayout(run_dir).cancel_file), dict):
        return ExitCode.HANG_CANCELLED
    return {
        "COMPLETED": ExitCode.OK,
        "CANCELLED": ExitCode.CANCELLED,
        "TIMEOUT": ExitCode.TIMEOUT,
    }.get(state, ExitCode.JOB_FAILED)


def cancel_job(job_id: str) -> None:
    out = subprocess.run(["scancel", job_id], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise UserError(f"scancel {job_id} failed: {out.stderr.strip()}")


def node_statuses(run_dir: Path) -> list[dict[str, Any]]:
    """Every node's last published status, as the sidecars wrote it."""
    layout = RunLayout(run_dir)
    if not layout.status_dir.is_dir():
        return []
    statuses = [read_json(p) for p in sorted(layout.status_dir.glob("*.json"))]
    return [s for s in statuses if isinstance(s, dict)]


def cancel_jobs(prefix: str) -> list[str]:
    """``scancel`` this user's jobs whose name starts with ``prefix``; their ids."""
    listed = subprocess.run(
        ["squeue", "--me", "-h", "-o", "%i %j"], capture_output=True, text=True, check=False
    )
    ids = [
        job_id
        for job_id, _, name in (line.partition(" ") for line in listed.stdout.splitlines())
        if name.startswith(prefix)
    ]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, check=False)
    return ids
