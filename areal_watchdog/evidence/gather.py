"""Gather one node's evidence: a stack from every live process of the job (in parallel), the
exits of the rest.

Produces plain ``RankEvidence``; it never classifies.
"""

from __future__ import annotations

import contextlib
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil

from areal_watchdog.common.atomic import mtime, read_json
from areal_watchdog.evidence.discovery import JobProcess
from areal_watchdog.evidence.kernel_readings.kernel_wait import main_wait
from areal_watchdog.evidence.listeners.faulthandler import dump_cooperative
from areal_watchdog.evidence.model import (
    BLOCKED,
    EXITED,
    RUNNING,
    UNRESPONSIVE,
    ExitInfo,
    RankEvidence,
    ThreadStack,
)
from areal_watchdog.evidence.pyspy import StackError, dump_pyspy
from areal_watchdog.rundir.layout import RunLayout

BUSY_CPU = 0.1  # cores busy over the last poll interval above which a rank counts as running
LOG_TAIL_LINES = 40
PYSPY_RETRY_DELAY = 0.2  # seconds before py-spy's second try
RUNNING_SAMPLES = 2  # more dumps of a running rank, so that a look sees whether it moves
SAMPLE_GAP = 0.15  # seconds between them


@dataclass(frozen=True)
class GatherSettings:
    """How to take stacks."""

    method: str = "auto"  # auto | py-spy | faulthandler
    timeout: float = 5.0
    # running ranks sampled again (``RUNNING_SAMPLES``): only once the job stepped, since each
    # dump suspends the rank, and ranks still starting (importing, loading) all run; repeated
    # dumps of them under a loaded machine slowed one job's start past 100 s
    sample_running: bool = False


def gather_node(
    layout: RunLayout,
    node: str,
    live: dict[int, JobProcess],
    gone: dict[int, JobProcess],
    cpu_recent: dict[int, float],
    settings: GatherSettings,
) -> list[RankEvidence]:
    """Evidence for every rank this node knows: stacks for ``live``, exit details for ``gone``."""
    results = gather_processes(layout, list(live.values()), cpu_recent, settings)
    agent_log = _read_tail(layout.logs_dir / f"torchrun_{node}.log", 400)
    for rank, proc in gone.items():
        if rank in live:
            continue
        results.append(_ended(layout, proc, agent_log))
    tails = rank_log_tails(layout, node, {item.local_rank for item in results})
    for item in results:
        item.log_tail = tails.get(item.local_rank, "")
    return sorted(results, key=lambda r: r.rank)


def gather_workers(
    layout: RunLayout,
    live: list[JobProcess],
    gone: list[JobProcess],
    cpu_recent: dict[int, float],
    settings: GatherSettings,
) -> list[RankEvidence]:
    """Evidence for the parts of an AReaL job without a rank (controller, rollout workers,
    servers): stacks for ``live``, exit details for ``gone``, in role order."""
    results = gather_processes(layout, live, cpu_recent, settings)
    results += [_ended(layout, proc, "") for proc in gone]
    return sorted(results, key=lambda r: (r.role or "", r.worker_index or 0, r.pid or 0))


def gather_processes(
    layout: RunLayout, procs: list[JobProcess], cpu_recent: dict[int, float],
    settings: GatherSettings,
) -> list[RankEvidence]:  # fmt: skip
    """A stack from each process, all in parallel under the dump timeout."""
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(procs)))) as pool:
        futures = [
            pool.submit(_stack_for, layout, proc, cpu_recent.get(proc.pid), settings)
            for proc in procs
        ]
        return [f.result() for f in futures]


def _ended(layout: RunLayout, proc: JobProcess, agent_log: str) -> RankEvidence:
    item = _evidence(proc)
    item.state = EXITED
    item.exit = exit_info(layout, proc, agent_log)
    return item


def _evidence(proc: JobProcess) -> RankEvidence:
    return RankEvidence(
        rank=proc.rank,
        node=proc.node,
        pid=proc.pid,
        local_rank=proc.local_rank,
        role=None if proc.role == "rank" else proc.role,
        worker_index=proc.index,
        address=proc.address,
        parent_pid=proc.parent_pid,
    )


def _stack_for(
    layout: RunLayout, proc: JobProcess, cpu: float | None, settings: GatherSettings
) -> RankEvidence:
    evidence = _evidence(proc)
    evidence.cpu_utilization = cpu
    errors = []
    with contextlib.suppress(psutil.Error):
        process = psutil.Process(proc.pid)
        evidence.process_status = process.status()
        evidence.cwd = process.cwd()  # the user's files are shown relative to it
    ask_the_rank = settings.method == "faulthandler"
    if settings.method in ("auto", "py-spy"):
        # a process blocked on a file (in D, or a FUSE reader) stops for no attach until its
        # wait ends: read it as it is
        wait = main_wait(proc.pid)
        stuck = wait is not None and wait.stuck
        evidence.threads, refused = _pyspy_stacks(proc.pid, settings.timeout, errors, stuck)
        if evidence.threads:
            evidence.evidence_method = "py-spy"
        ask_the_rank = refused and settings.method == "auto"
    if not evidence.threads and ask_the_rank:
        if proc.cooperative_signal:
            try:
                evidence.threads = dump_cooperative(
                    proc.pid, proc.cooperative_signal, stack_file(layout, proc), settings.timeout
                )
                evidence.evidence_method = "faulthandler"
            except StackError as exc:
                errors.append(f"faulthandler: {exc}")
        else:
            errors.append("faulthandler: the process did not arm the cooperative dump")
    if not psutil.pid_exists(proc.pid):
        evidence.state = EXITED
        evidence.exit = exit_info(layout, proc, "")
    elif evidence.threads:
        evidence.state = RUNNING if cpu is not None and cpu >= BUSY_CPU else BLOCKED
        if evidence.state == RUNNING and proc.rank is not None and settings.sample_running:
            evidence.samples = _more_samples(proc.pid, settings.timeout)
        if errors and evidence.evidence_method == "faulthandler":
            evidence.error = f"{'; '.join(errors)}; the stacks are the rank's own faulthandler's"
    else:
        evidence.state = UNRESPONSIVE
        evidence.error = "; ".join(errors)
    return evidence


def _pyspy_stacks(
    pid: int, timeout: float, errors: list[str], nonblocking: bool = False
) -> tuple[list[ThreadStack], bool]:
    """py-spy's stacks, and whether py-spy was refused (or absent): only then is the rank's own
    faulthandler asked. Under load a dump sometimes fails reading memory the process is
    changing (a second try a moment later answers); a dump that ran out of time suspending a
    busy many-threaded process is tried once without suspending it. A late py-spy is no reason
    to signal the process: faulthandler walks every thread's frames from a signal handler
    while they run, and CI saw an AReaL rollout worker segfault inside that dump. A process
    in the kernel (``nonblocking``) is never suspended: it would not stop before its wait ends
    (a read from storage that stopped answering: the dump waited out its timeout)."""
    for attempt in range(2):
        try:
            return dump_pyspy(pid, timeout, nonblocking=nonblocking), False
        except StackError as exc:
            errors.append(str(exc) + (" (not suspending it)" if nonblocking else ""))
            if exc.permission or attempt:
                return [], exc.permission
            nonblocking = nonblocking or exc.late
            time.sleep(0 if exc.late else PYSPY_RETRY_DELAY)
    return [], False


def _more_samples(pid: int, timeout: float) -> list[list[ThreadStack]]:
    """A running rank's later dumps (those py-spy answers): one sample of a rank that computes
    shows one function of many, and a second look compares the functions it saw in all of
    them (``diagnose.movement``); a rank spinning in one loop is seen in one place every time."""
    samples = []
    for _ in range(RUNNING_SAMPLES):
        time.sleep(SAMPLE_GAP)
        with contextlib.suppress(StackError):
            samples.append(dump_pyspy(pid, timeout))
    return samples


def stack_file(layout: RunLayout, proc: JobProcess) -> Path:
    """Where the process's cooperative dump lands: by rank (our rank wrapper), or by pid (the
    sitecustomize hook)."""
    if proc.hooked or proc.rank is None:
        return layout.process_stack_file(proc.pid)
    return layout.stack_file(proc.rank)


def exit_info(layout: RunLayout, proc: JobProcess, agent_log: str) -> ExitInfo:
    """How a process ended: its own exit record, else what the torchrun agent logged for it."""
    pid = proc.pid
    if proc.hooked or proc.rank is None:
        path = layout.process_exit_record(pid)
    else:
        path = layout.exit_record(proc.rank)
    record = read_json(path)
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


def rank_log_tails(layout: RunLayout, node: str, local_ranks: set[int | None]) -> dict[int, str]:
    """The last lines of each rank's stdout and stderr from torchrun's newest attempt. torchrun's
    log folders are looked through once for all the node's ranks (once a rank, they were most of
    a follower's path operations in an answer on the shared filesystem)."""
    wanted = {str(r) for r in local_ranks if r is not None}
    if not wanted:
        return {}
    attempts = (layout.torchrun_logs_dir / node).glob("*/attempt_*/*")
    folders = [f for f in attempts if f.name in wanted]
    newest = {int(folder.name): folder for folder in sorted(folders, key=mtime)}
    tails = {}
    for rank, folder in newest.items():
        parts = []
        for name in ("stdout.log", "stderr.log"):
            text = _read_tail(folder / name, LOG_TAIL_LINES)
            if text.strip():
                parts.append(f"--- {name} ---\n{text}")
        tails[rank] = "\n".join(parts)
    return tails


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
