"""A Slurm run for ``areal-launch status`` and ``cancel``: by job id (``slurm://123``, ``123``)
or by the run directory it was submitted from (its ``slurm_job.json``)."""

from __future__ import annotations

from pathlib import Path

from areal_watchdog.launch.run_handle import Described
from areal_watchdog.launch.slurm.control.jobs import (
    cancel_job,
    job_state,
    recorded_job_id,
    resolve_job,
)
from areal_watchdog.rundir.secure import check_run_dir


def recognises(run_dir: Path) -> bool:
    """Whether a job was submitted from ``run_dir`` (UserError when its record is forged)."""
    return recorded_job_id(run_dir) is not None


def describe(target: str) -> Described:
    """The job's state, and its run directory (named by the job's comment: ours to read?)."""
    job_id, run_dir = resolve_job(target)
    fields = job_state(job_id)
    state = fields.get("JobState", "UNKNOWN (no longer known to the controller)")
    line = (
        f"job {job_id}: {state}"
        + (f" on {fields['NodeList']}" if fields.get("NodeList") else "")
        + (f" ({fields['Reason']})" if fields.get("Reason") not in (None, "None") else "")
    )
    return Described([line], check_run_dir(run_dir) if run_dir else None)


def cancel(target: str) -> str:
    """``scancel`` the job; its run directory stays."""
    job_id, run_dir = resolve_job(target)
    cancel_job(job_id)
    return f"[areal-launch] cancelled job {job_id}" + (
        f"; run dir kept: {run_dir}" if run_dir else ""
    )
