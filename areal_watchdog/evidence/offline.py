"""Evidence from files, after the fact: a directory of Flight Recorder dumps, or an incident.

``areal-launch diagnose PATH`` reads either:

- an incident directory (or its ``evidence.json``): everything the watchdog gathered, replayed
  into the classifier as it is today;
- a directory of per-rank Flight Recorder dumps, whatever wrote them: ``TORCH_NCCL_DUMP_ON_TIMEOUT``
  or NCCL's dump pipe (``<prefix><rank>``, pickle), ``_dump_fr_trace_json()`` output, or our
  listener's ``fr_rank_<r>.json``. The rank is the number that ends the file name (before any
  ``.json`` / ``.pkl``), or the ``rank`` a listener record carries. Files that are not dumps are
  skipped; with two dumps for one rank the newest wins.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_watchdog.common.errors import UserError
from areal_watchdog.evidence.listeners.flight_recorder import parse_trace, strip
from areal_watchdog.evidence.model import Evidence
from areal_watchdog.rundir.secure import check_ancestors

_RANK_SUFFIX = re.compile(r"(\d+)(?:\.json|\.pkl|\.pickle)?$")
MAX_DUMP_BYTES = 512 * 2**20  # a full 2000-entry dump with stacks is a few MB


@dataclass
class OfflineInput:
    """What was read, and from where."""

    evidence: Evidence
    source: str  # "incident" | "flight_recorder"
    files: dict[int, str] = field(default_factory=dict)  # rank -> dump file used
    skipped: list[str] = field(default_factory=list)  # files that were not dumps


TRUSTED_FIX = "copy the files into a directory of yours and diagnose the copy"


def load(path: Path) -> OfflineInput:
    """Read PATH; raises UserError (one line) when it holds neither kind of evidence. What
    another user could have written is not read: PATH and the directories above it follow the
    run directory's rules (``rundir.secure``), and a dump file someone else owns is skipped."""
    check_ancestors(path if path.is_dir() else path.parent, TRUSTED_FIX)
    if path.is_file() and path.name == "evidence.json":
        return _incident(path)
    if not path.is_dir():
        raise UserError(
            f"{path}: no such directory (expected Flight Recorder dumps or an incident)"
        )
    if (path / "evidence.json").is_file():
        return _incident(path / "evidence.json")
    return _dump_dir(path)


def _incident(path: Path) -> OfflineInput:
    if not _trusted(path):
        raise UserError(f"{path}: owned by another user or not a plain file; {TRUSTED_FIX}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        evidence = Evidence.from_dict(data)
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise UserError(f"{path}: not a readable evidence file ({type(exc).__name__})") from None
    return OfflineInput(evidence, "incident", {})


def _dump_dir(path: Path) -> OfflineInput:
    found: dict[int, tuple[float, str, dict[str, Any]]] = {}
    skipped = []
    try:
        files = sorted(path.iterdir())
    except OSError as exc:
        raise UserError(f"{path}: cannot list the directory ({exc.strerror})") from None
    for file in files:
        item = _read_dump(file)
        if item is None:
            if not file.name.startswith("."):
                skipped.append(file.name)
            continue
        rank, mtime, trace = item
        if rank not in found or mtime > found[rank][0]:
            found[rank] = (mtime, file.name, trace)
    if not found:
        raise UserError(
            f"{path}: no Flight Recorder dump here (expected one file per rank named "
            f"<prefix><rank>, pickle or JSON, or an incident's evidence.json)"
        )
    traces = {rank: strip(trace) for rank, (_, _, trace) in found.items()}
    evidence = Evidence(
        world_size=_world_size(traces),
        ranks=[],
        flight_records={str(rank): trace for rank, trace in sorted(traces.items())},
    )
    files = {rank: name for rank, (_, name, _) in sorted(found.items())}
    return OfflineInput(evidence, "flight_recorder", files, skipped)


def _read_dump(file: Path) -> tuple[int, float, dict[str, Any]] | None:
    """(rank, mtime, trace) for a regular file that holds one rank's dump."""
    try:
        info = file.lstat()
        if not _trusted(file) or info.st_size > MAX_DUMP_BYTES:
            return None
        data = file.read_bytes()
    except OSError:
        return None
    trace = parse_trace(data)
    if trace is None:
        return None
    rank = _rank_of(file.name, data)
    return None if rank is None else (rank, info.st_mtime, trace)


def _trusted(file: Path) -> bool:
    """A regular file (no symlink) owned by us or root."""
    try:
        info = file.lstat()
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid in (0, os.geteuid())


def _rank_of(name: str, data: bytes) -> int | None:
    if data[:1] == b"{":
        try:
            record = json.loads(data.decode("utf-8"))
        except ValueError:
            record = {}
        if isinstance(record, dict) and isinstance(record.get("rank"), int):
            return record["rank"]
    match = _RANK_SUFFIX.search(name)
    return int(match.group(1)) if match else None


def _world_size(traces: dict[int, dict[str, Any]]) -> int:
    """One more than the highest rank seen in a file name or in a group's member list."""
    highest = max(traces)
    for trace in traces.values():
        for config in (trace.get("pg_config") or {}).values():
            listed = re.findall(r"\d+", str((config or {}).get("ranks", "")))
            highest = max([highest, *(int(r) for r in listed)])
    return highest + 1
