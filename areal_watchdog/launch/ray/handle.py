"""A Ray run for ``areal-launch status`` and ``cancel`` (``ray://RUN_DIR`` or the run
directory): its ``launch.json`` names the Ray job and the Jobs API it was submitted to, which
says its state and stops it. A run whose Jobs API no longer answers (its own cluster ended with
its launcher) is ended by its processes on this machine, as a local run is."""

from __future__ import annotations

from pathlib import Path

from areal_watchdog.common.errors import UserError
from areal_watchdog.launch.ray.jobs import RayJobs
from areal_watchdog.launch.run_handle import Described, cancel_run, run_directory
from areal_watchdog.rundir.launch_info import LaunchInfo


def describe(target: str, note: str) -> Described:
    """The Ray job's state as its Jobs API says it, beside the run directory's records."""
    run_dir = run_directory(target)
    job = _job(target, run_dir)
    if job is None:
        return Described([], run_dir, note)
    address, submission_id = job
    try:
        state = RayJobs(address).status(submission_id)
    except UserError:
        state = "UNKNOWN (the Jobs API does not answer: its cluster may have ended)"
    return Described([f"Ray job {submission_id} at {address}: {state}"], run_dir, note)


def cancel(target: str) -> str:
    """Ask the Jobs API to stop the job (its launcher then reports the end); where it does not
    answer, end the run's processes here."""
    run_dir = run_directory(target)
    job = _job(target, run_dir)
    if job is not None:
        address, submission_id = job
        try:
            stopped = RayJobs(address).stop(submission_id)
        except UserError:
            stopped = False
        if stopped:
            return (
                f"[areal-launch] asked Ray at {address} to stop job {submission_id}; "
                f"run dir kept: {run_dir}"
            )
    return cancel_run(target)


def _job(target: str, run_dir: Path) -> tuple[str, str] | None:
    """The Jobs API's URL and the submission id ``launch.json`` (of the checked ``run_dir``)
    records, if it does."""
    try:
        info = LaunchInfo.load(run_dir)
    except (UserError, TypeError, KeyError):
        raise UserError(f"{target}: no readable watchdog/launch.json: no Ray job known") from None
    if info.job_address and info.job_id:
        return info.job_address, info.job_id
    return None
