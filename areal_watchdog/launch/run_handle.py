"""A launched run as ``areal-launch status`` and ``cancel`` name it: a handle
(``slurm://123``, ``local://RUN_DIR``, ``ray://RUN_DIR``, as torchx's ``AppHandle``) or a bare
run directory or Slurm job id. The backend that launched a run describes and cancels it
(``Backend.describe``, ``Backend.cancel``); what every backend shares is here: the run
directory's own records, and the processes of a run on this machine, which carry its run id."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from areal_watchdog.common.atomic import read_json
from areal_watchdog.common.errors import UserError
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.run_processes import kill_run_processes
from areal_watchdog.rundir.secure import check_run_dir


@dataclass(frozen=True)
class Described:
    """What a backend says of a run: its own lines (Slurm: the job's state), and the run
    directory (checked) whose records ``status`` shows, with a note on what kind of run it is."""

    lines: list[str]
    run_dir: Path | None
    note: str = ""


def split_handle(text: str) -> tuple[str | None, str]:
    """``slurm://123`` -> (``slurm``, ``123``); anything else -> (None, as given)."""
    scheme, sep, rest = text.partition("://")
    return (scheme, rest) if sep and scheme.isidentifier() else (None, text)


def launched_by(run_dir: Path) -> str | None:
    """The backend named in a run directory's ``launch.json``, if it holds one."""
    record = read_json(RunLayout(run_dir).launch_file)
    return record.get("backend") if isinstance(record, dict) else None


def run_directory(target: str) -> Path:
    """``target`` as a run directory of ours, checked; UserError when it is none."""
    path = Path(target)
    if not (path.is_dir() or path.is_symlink()):
        raise UserError(f"{target}: no such run directory")
    return check_run_dir(path)


def describe_run(target: str, note: str) -> Described:
    """A run known by its run directory alone."""
    return Described([], run_directory(target), note)


def cancel_run(target: str) -> str:
    """End every process of a run on this machine (its launcher then reports the job ended)."""
    run_dir = run_directory(target)
    try:
        run_id = LaunchInfo.load(run_dir).run_id
    except (UserError, TypeError, KeyError):
        raise UserError(f"{target}: no readable watchdog/launch.json: nothing to cancel") from None
    ended = kill_run_processes(run_id)
    if not ended:
        return f"[areal-launch] run {run_id}: no process of it is running; run dir kept: {run_dir}"
    return f"[areal-launch] ended {len(ended)} process(es) of run {run_id}; run dir kept: {run_dir}"


class KnownByRunDir:
    """``recognises``, ``describe`` and ``cancel`` for a backend whose runs are known by their
    run directory alone (local, Ray): ``launch.json`` names it, ``run_note`` says what it is."""

    name: str
    run_note: str = ""

    @classmethod
    def recognises(cls, run_dir: Path) -> bool:
        return launched_by(run_dir) == cls.name

    @classmethod
    def recognises_job(cls, text: str) -> bool:
        return False  # its runs have no id but their directory

    @classmethod
    def describe(cls, target: str) -> Described:
        return describe_run(target, cls.run_note)

    @classmethod
    def cancel(cls, target: str) -> str:
        return cancel_run(target)


class UnrecordedRun(KnownByRunDir):
    """A run directory no backend recognises (no ``launch.json`` names one): its records, and
    whatever of it runs on this machine."""

    name = ""
    run_note = " (no backend named in watchdog/launch.json)"
