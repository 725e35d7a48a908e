"""Gather one node's evidence: a stack from every live rank (in parallel), exits of the rest.

Produces plain ``RankEvidence``; it never classifies.
"""

from __future__ import annotations

import contextlib
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil

from areal_watchdog.common.atomic import read_json
from areal_watchdog.evidence.discovery import RankProcess
from areal_watchdog.evidence.faulthandler import dump_cooperative
from areal_watchdog.evidence.model import (
    BLOCKED,
    EXITED,
    RUNNING,
    UNRESPONSIVE,
    ExitInfo,
    RankEvidence,
)
from areal_watchdog.evidence.pyspy import StackError, dump_pyspy
from areal_watchdog.rundir.layout import RunLayout

BUSY_CPU = 0.1  # cores busy over the last poll interval above which a rank counts as running
LOG_TAIL_LINES = 40


@dataclass(frozen=True)
class GatherSettings:
    """How to take stacks."""

    method: str = "auto"  # auto | py-spy | faulthandler
    timeout: float = 5.0


def gather_node(
    layout: RunLayout,
    node: str,
    live: dict[int, RankProcess],
    gone: dict[int, RankProcess],
    cpu_recent: dict[int, float],
    settings: GatherSettings,
) -> list[RankEvidence]:
    """Evidence for every rank this node knows: stacks for ``live``, exit details for ``gone``."""
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(live)))) as pool:
        futures = {
            rank: pool.submit(_stack_for, layout, proc, cpu_recent.get(proc.pid), settings)
            for rank, proc in live.items()
        }
        results = [f.result() for f in futures.values()]
    agent_log = _read_tail(layout.logs_dir / f"torchrun_{node}.log", 400)
    for rank, proc in gone.items():
        if rank in live:
            continue
        results.append(
            RankEvidence(
                rank=rank,
                node=node,
                pid=proc.pid,
                local_rank=proc.local_rank,
                state=EXITED,
                exit=exit_info(layout, rank, proc.pid, agent_log),
            )
        )
    for item in results:
        item.log_tail = rank_log_tail(layout, node, item.local_rank)
    return sorted(results, key=lambda r: r.rank)


def _stack_for(
    layout: RunLayout, proc: RankProcess, cpu: float | None, settings: GatherSettings
) -> RankEvidence:
    evidence = RankEvidence(
        rank=proc.rank,
        node=proc.node,
        pid=proc.pid,
        local_rank=proc.local_rank,
        cpu_utilization=cpu,
    )
    errors = []
    with contextlib.suppress(psutil.Error):
        evidence.process_status = psutil.Process(proc.pid).status()
    if settings.method in ("auto", "py-spy"):
        try:
            evidence.threads = dump_pyspy(proc.pid, settings.timeout)
            evidence.evidence_method = "py-spy"
        except StackError as exc:
            errors.append(str(exc))
    if not evidence.threads and settings.method in ("auto", "faulthandler"):
        if proc.cooperative_signal:
            try:
                evidence.threads = dump_cooperative(
                    proc.pid,
                    proc.cooperative_signal,
                    layout.stack_file(proc.rank),
                    settings.timeout,
                )
                evidence.evidence_method = "faulthandler"
            except StackError as exc:
                errors.append(f"faulthandler: {exc}")
        else:
            errors.append("faulthandler: the rank did not arm the cooperative dump")
    if not psutil.pid_exists(proc.pid):
        evidence.state = EXITED
        evidence.exit = exit_info(layout, proc.rank, proc.pid, "")
    elif evidence.threads:
        evidence.state = RUNNING if cpu is not None and cpu >= BUSY_CPU else BLOCKED
    else:
        evidence.state = UNRESPONSIVE
        evidence.error = "; ".join(errors)
    return evidence


def exit_info(layout: RunLayout, rank: int, pid: int | None, agent_log: str) -> ExitInfo:
    """How a rank ended: its own exit record, else what the torchrun agent logged for its pid."""
    record = read_json(layout.exit_record(rank))
    if isinstance(record, dict) and (pid is None or record.get("pid") == pid):
        return ExitInfo(
            code=record.get("code"),
            kind=str(record.get("kind", "unknown")),
            time=record.get("time"),
            exc_type=record.get("exc_type"),
            message=record.get("message"),
            traceback=record.get("traceback"),
        )
    if pid is not None:
        match = re.search(rf"exitcode\s*:\s*(-?\d+)\s*\(pid:\s*{pid}\)", agent_log)
        if match:
            code = int(match.group(1))
            return ExitInfo(code=code, kind="signal" if code < 0 else "exit")
    return ExitInfo()


def rank_log_tail(layout: RunLayout, node: str, local_rank: int | None) -> str:
    """The last lines of a rank's stdout and stderr from torchrun's newest attempt."""
    if local_rank is None:
        return ""
    base = layout.torchrun_logs_dir / node
    attempts = sorted(base.glob(f"*/attempt_*/{local_rank}"), key=_mtime)
    if not attempts:
        return ""
    parts = []
    for name in ("stdout.log", "stderr.log"):
        text = _read_tail(attempts[-1] / name, LOG_TAIL_LINES)
        if text.strip():
            parts.append(f"--- {name} ---\n{text}")
    return "\n".join(parts)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _read_tail(path: Path, lines: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            start = max(0, size - 64 * 1024)
            fh.seek(start)
            data = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    kept = data.splitlines()[1 if start else 0 :]  # never a line cut in half (half a secret)
    return "\n".join(kept[-lines:])
