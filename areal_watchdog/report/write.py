"""Write one incident directory: evidence, stacks and log tails first, the report last, so a
report.json on disk means the incident is complete. Secrets are scrubbed here, once, from
everything written (the report handed in is scrubbed already). The files the report links are
written in place, not through a temporary file each: nothing reads them before the report
exists, and the temporary file's rename and mode were two more round trips a file on NFS."""

from __future__ import annotations

import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import (
    json_text,
    write_json_atomic,
    write_text_atomic,
    write_text_in_place,
)
from areal_watchdog.common.secrets.redact import Redactor
from areal_watchdog.evidence.model import Evidence, RankEvidence
from areal_watchdog.report.markdown import render_markdown

FILES_FOR_ALL = 64  # ranks up to which every rank gets its own stack and log file
# Files written side by side: on a network filesystem each is a few round trips (one after the
# other, an incident of 1,024 nodes took 3.2 s to write on the sshfs stand-in; 1,024 files
# took 1.16 s eight at a time there, 0.87 s sixteen at a time).
WRITERS = 16


def write_incident(
    run_dir: Path,
    report: dict[str, Any],
    evidence: Evidence,
    redactor: Redactor,
    by_node: dict[str, list[dict[str, Any]]] | None = None,
    folder: str = "incidents",
    history: dict[str, Any] | None = None,
) -> Path:
    """Write the incident directory; the report goes last so its presence means "complete".
    ``by_node``: every rank's entry, one file per node, when the report holds a few
    (``report.bound``); ``folder``: ``incidents``, or ``suspected`` for a look nobody was paged
    for."""
    incident_dir = run_dir / folder / report["incident_id"]
    dir_mode, file_mode = _modes(run_dir)
    folders = ["stacks", "logs", *(["ranks"] if by_node else [])]
    for path in (incident_dir.parent, incident_dir, *(incident_dir / f for f in folders)):
        path.mkdir(mode=dir_mode, exist_ok=True)
        _chmod_dir(path, dir_mode)
    files = [
        (incident_dir / "ranks" / f"{re.sub(r'[^A-Za-z0-9._-]', '_', node)}.json",  # never a path
         json_text(entries, compact=True))
        for node, entries in (by_node or {}).items()
    ]  # fmt: skip
    files += _process_files(incident_dir, evidence, report, redactor)
    with ThreadPoolExecutor(WRITERS) as pool:  # the first error is raised by list()
        list(pool.map(lambda file: write_text_in_place(*file, mode=file_mode), files))
    clean_evidence = redactor.scrub_tree(evidence.to_dict())
    write_json_atomic(incident_dir / "evidence.json", clean_evidence, mode=file_mode, compact=True)
    if history is not None:
        write_json_atomic(incident_dir / "history.json", history, mode=file_mode, compact=True)
    write_text_atomic(incident_dir / "report.md", render_markdown(report), mode=file_mode)
    write_json_atomic(incident_dir / "report.json", report, fsync=True, mode=file_mode)
    return incident_dir


def prune_oldest(folder: Path, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` report folders of ``folder`` (their names start with
    their time, so they sort by it): a job that is slow at every step writes a suspected look
    each time, and they must not fill the disk. Only real folders that hold a report go, never
    through a link. Returns what was removed."""
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    looks = [p for p in entries if not p.is_symlink() and (p / "report.json").is_file()]
    removed = looks[: max(0, len(looks) - keep)]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def _process_files(
    incident_dir: Path, evidence: Evidence, report: dict[str, Any], redactor: Redactor
) -> list[tuple[Path, str]]:
    """Each process's stack file and log tail (with its traceback), scrubbed."""
    files = []
    for process in _with_files(evidence, report):
        name = f"{file_stem(process)}.txt"
        files.append((incident_dir / "stacks" / name, redactor.scrub(_stack_text(process))))
        tail = process.log_tail or ""
        if process.exit is not None and process.exit.traceback:
            tail = f"{tail}\n--- traceback ---\n{process.exit.traceback}"
        if tail.strip():
            files.append((incident_dir / "logs" / name, redactor.scrub(tail)))
    return files


def _with_files(evidence: Evidence, report: dict[str, Any]) -> list[RankEvidence]:
    """The processes that get a stack file and a log file: all of them in a job of up to
    ``FILES_FOR_ALL`` ranks; beyond, the culprits and the first rank of every stack group (the
    rest are in evidence.json), so that a job of thousands of ranks writes tens of files."""
    if len(evidence.ranks) <= FILES_FOR_ALL:
        return evidence.processes()
    wanted = set(report["culprit_ranks"]) | {g["ranks"][0] for g in report["groups"]}
    return [r for r in evidence.ranks if r.rank in wanted] + evidence.workers


def _modes(run_dir: Path) -> tuple[int, int]:
    """(directory, file) modes: 0700/0600, or 0750/0640 when the run directory lets its group
    read (``launch.run_dir_mode``); never readable by others, since log tails hold whatever the
    job printed."""
    shared = run_dir.stat().st_mode & 0o040
    return (0o750, 0o640) if shared else (0o700, 0o600)


def _chmod_dir(path: Path, mode: int) -> None:
    """``chmod`` through a descriptor (whatever the umask), refusing a planted symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def file_stem(process: RankEvidence) -> str:
    """``rank_3`` for a rank; ``rollout_0_pid1234``, ``controller_pid1200`` for the others."""
    if process.rank is not None:
        return f"rank_{process.rank}"
    index = "" if process.worker_index is None else f"_{process.worker_index}"
    return f"{process.role or 'process'}{index}_pid{process.pid}"


def _stack_text(rank: RankEvidence) -> str:
    lines = [
        f"{rank.label()} pid {rank.pid} node {rank.node} state {rank.state} "
        f"via {rank.evidence_method}"
    ]
    if rank.error:
        lines.append(f"error: {rank.error}")
    for thread in rank.threads:
        lines.append(f"\nThread {thread.name or '?'} (most recent call first):")
        lines.extend(f'  File "{f.filename}", line {f.line}, in {f.name}' for f in thread.frames)
    return "\n".join(lines) + "\n"
