"""Follow and end a submitted Slurm job by id: state, waiting, cancelling, node statuses.

A job id reaches ``scontrol``/``scancel`` only after it matched Slurm's grammar (``123``,
``123_4``, ``123+1``): an id read from a file can never become an option (``--user=root``).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from areal_watchdog.common.atomic import read_json
from areal_watchdog.common.errors import UserError
from areal_watchdog.common.rankset import format_ranks
from areal_watchdog.launch.exit_codes import ExitCode
from areal_watchdog.launch.slurm.control.same_allocation import attempt_ended
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.secure import check_run_dir
from areal_watchdog.rundir.sidecar_files.hang_request import HangRequest

JOB_ID = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,9})?(?:\+[0-9]{1,6})?")
ACTIVE_STATES = (
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED",
)  # fmt: skip


def slurm(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """One Slurm client command; UserError (one line) when Slurm's commands are not here."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise UserError(
            f"{argv[0]}: cannot run it ({exc.strerror}): Slurm's client commands must be on "
            "PATH (run on a Slurm login node; Debian: apt-get install slurm-client)"
        ) from None


def last_said(out: subprocess.CompletedProcess[str], default: str = "no message") -> str:
    """The last line a Slurm command wrote to stderr: the one that says why."""
    return (out.stderr.strip().splitlines() or [default])[-1]


class ControllerSilent(UserError):
    """slurmctld did not answer (busy, restarting, out of reach): a job's state is unknown,
    which is not a job that ended."""


def job_state(job_id: str) -> dict[str, str]:
    """``scontrol show job``'s fields (JobState, Reason, NodeList, Comment...); empty once the
    controller forgot the job; ControllerSilent when it did not answer."""
    out = slurm(["scontrol", "show", "job", "-o", checked_job_id(job_id)])
    if out.returncode == 0:
        return dict(re.findall(r"(\w+)=(\S*)", out.stdout))
    said = last_said(out)
    if "Invalid job id" in said:
        return {}
    raise ControllerSilent(f"scontrol show job {job_id}: {said}")


def expand_nodelist(nodelist: str) -> list[str]:
    """A Slurm nodelist (``node[1-3],gpu7``) as node names, in Slurm's order."""
    out = slurm(["scontrol", "show", "hostnames", nodelist])
    if out.returncode != 0:
        raise UserError(f"scontrol show hostnames {nodelist}: {out.stderr.strip() or 'failed'}")
    return out.stdout.split()


def cluster_nodes() -> set[str]:
    """The node names this cluster knows (``sinfo -N``): sbatch refuses an ``--exclude`` of
    any other name, so nothing else may go there. Empty when Slurm does not answer."""
    out = slurm(["sinfo", "-h", "-N", "-o", "%N"])
    return set(out.stdout.split()) if out.returncode == 0 else set()


def checked_job_id(value: object, source: str = "job id") -> str:
    """``value`` as a Slurm job id, or UserError: never anything that a command line could
    read as an option or as several arguments."""
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    if not JOB_ID.fullmatch(text):
        raise UserError(
            f"{source}: {value!r} is not a Slurm job id (digits, as 123, 123_4 or 123+1): "
            "refusing to pass it to Slurm"
        )
    return text


def recorded_job_id(run_dir: Path) -> str | None:
    """The job id ``slurm`` recorded in a run directory (checked), None when it holds none."""
    path = RunLayout(run_dir).slurm_job_file
    record = read_json(path)
    if not isinstance(record, dict):
        return None
    return checked_job_id(record.get("job_id"), f"{path}: job_id")


def resolve_job(target: str) -> tuple[str, Path | None]:
    """A run directory (ours: ``check_run_dir``) or a job id -> (job id, run directory if
    known: the job's comment names it; the caller checks it before reading it)."""
    path = Path(target)
    if path.is_dir() or path.is_symlink():
        run_dir = check_run_dir(path)
        job_id = recorded_job_id(run_dir)
        if job_id is None:
            raise UserError(f"{target}: no Slurm job was submitted from this run directory")
        return job_id, run_dir
    if not JOB_ID.fullmatch(target):
        raise UserError(f"{target}: neither a run directory nor a Slurm job id")
    comment = job_state(target).get("Comment", "")
    run_dir = Path(comment.split(":", 1)[1]) if comment.startswith("areal-watchdog:") else None
    return target, run_dir


def wait_for_job(
    job_id: str,
    run_dir: Path,
    poll: float = 2.0,
    out: Callable[[str], object] = print,
    attempts: bool = False,
) -> int:
    """Follow a job to its end (``attempts``: or to the end of an attempt after a hang, its
    allocation kept); the exit code says how it ended (see docs/cli.md)."""
    last, layout, silent = None, RunLayout(run_dir), Silence(out)
    while True:
        try:
            state = job_state(job_id).get("JobState", "UNKNOWN")
        except ControllerSilent as exc:
            silent.heard(f"job {job_id}", str(exc))
            time.sleep(poll)
            continue
        silent.over()
        if state != last:
            out(f"[areal-launch] job {job_id}: {state}")
            last = state
        if state not in ACTIVE_STATES:
            break
        if attempts and attempt_ended(layout, job_id):
            out(f"[areal-launch] job {job_id}: its step ended after a hang; allocation kept")
            return ExitCode.HANG_CANCELLED
        time.sleep(poll)
    if HangRequest.read(layout) is not None:
        return ExitCode.HANG_CANCELLED
    code = {
        "COMPLETED": ExitCode.OK,
        "CANCELLED": ExitCode.CANCELLED,
        "TIMEOUT": ExitCode.TIMEOUT,
    }.get(state, ExitCode.JOB_FAILED)
    if code is ExitCode.JOB_FAILED:
        out(f"[areal-launch] job {job_id} {state}: {why_failed(layout, job_id)}")
    return code


class Silence:
    """A controller that does not answer, said on the terminal: at once, then every minute, then
    when it answers again. ``--wait`` waits it out as ``srun`` does: the job runs on meanwhile."""

    EVERY = 60.0

    def __init__(self, out: Callable[[str], object]) -> None:
        self.out: Callable[[str], object] = out
        self.answered = time.monotonic()  # the controller's last answer
        self.said: float | None = None  # when the silence was last mentioned

    def heard(self, what: str, error: str) -> None:
        now = time.monotonic()
        if self.said is None or now - self.said >= self.EVERY:
            self.out(f"[areal-launch] {what}: Slurm's controller has not answered for "
                     f"{now - self.answered:.0f} s ({error}); waiting for it")  # fmt: skip
            self.said = now

    def over(self) -> None:
        now = time.monotonic()
        if self.said is not None:
            self.out(f"[areal-launch] Slurm's controller answers again after "
                     f"{now - self.answered:.0f} s")  # fmt: skip
        self.answered, self.said = now, None


def why_failed(layout: RunLayout, job_id: str) -> str:
    """What the job's nodes recorded of a failure, and where to read on: ``--wait`` would
    otherwise end on a bare FAILED."""
    ends = [read_json(p) for p in sorted(layout.job_exit_dir.glob("*.json"))]
    said = [
        f"{e.get('node')}'s part exited with code {e.get('returncode')}"
        for e in ends
        if isinstance(e, dict) and e.get("returncode") != 0
    ]
    finished = read_json(layout.finished_file)  # this run's: a launch removes an older one
    incidents = finished.get("incidents") if isinstance(finished, dict) else None
    for name in incidents if isinstance(incidents, list) else []:
        folder = layout.incidents_dir / Path(str(name)).name  # never a path the record names
        report = read_json(folder / "report.json")
        if isinstance(report, dict):
            ranks = report.get("culprit_ranks")
            culprits = format_ranks(ranks) if isinstance(ranks, list) and ranks else "none"
            said.append(
                f"reported {report.get('category')} (culprit ranks {culprits}): "
                f"{folder / 'report.md'}"
            )
    if not said:
        said = ["no node recorded its part's end (it did not start, or Slurm ended it)"]
    logs = layout.logs_dir / "submitit" / f"{checked_job_id(job_id)}_*_log.out"
    return "; ".join(said) + f"; logs: {logs} and {layout.logs_dir}"


def job_steps(job_id: str) -> list[str]:
    """The job's running steps (``123.0``, ``123.1``: the job's tasks and the sidecars), not
    its batch script: ending them ends an attempt and keeps the allocation."""
    listed = slurm(["squeue", "-h", "-s", "-j", checked_job_id(job_id), "-o", "%i"])
    return [s for s in listed.stdout.split() if re.fullmatch(rf"{re.escape(job_id)}\.[0-9]+", s)]


def cancel_job(job_id: str) -> None:
    out = slurm(["scancel", checked_job_id(job_id)])
    if out.returncode != 0:
        raise UserError(f"scancel {job_id} failed: {last_said(out)}")


def cancel_jobs(prefix: str) -> list[str]:
    """``scancel`` this user's jobs whose name starts with ``prefix``; their ids."""
    try:
        listed = slurm(["squeue", "--me", "-h", "-o", "%i %j"])
    except UserError:
        return []
    ids = [
        job_id
        for job_id, _, name in (line.partition(" ") for line in listed.stdout.splitlines())
        if name.startswith(prefix) and JOB_ID.fullmatch(job_id)
    ]
    if ids:
        slurm(["scancel", *ids])
    return ids
