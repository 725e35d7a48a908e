"""A rank is its whole process tree: what its descendants do (DataLoader workers, a copy or
upload subprocess, compile workers, a reward process pool) is the rank's work.

``TreeMeter`` follows one process's descendants from poll to poll through the kernel's lists
of each thread's children (``/proc/PID/task/TID/children``: no scan of every process) and turns
their counters into rates over the same windows as the process's own: bytes read and written,
bytes to and from storage, CPU. A descendant counts from the poll it is first seen (its history
before is not this window's), and one that ended takes its last window with it.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psutil

from areal_watchdog.evidence.kernel_readings.counters import (
    CHILDREN_CPU_FLOOR,
    Counters,
    rates,
    read_counters,
)
from areal_watchdog.evidence.kernel_readings.kernel_wait import kernel_waits
from areal_watchdog.evidence.pyspy import StackError, dump_pyspy

MAX_DESCENDANTS = 64  # per process: a fork bomb is no reason to read a thousand /proc entries
CHILDREN_SHOWN = 8  # per process in a report: the ones it waits on come first
CHILD_FRAMES = 8  # innermost frames of a child's busiest Python thread
COMMAND_CHARS = 300


def child_pids(pid: int) -> list[int]:
    """The direct children of ``pid``, from each of its threads' lists."""
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        with (
            contextlib.suppress(OSError, ValueError),  # a thread that just ended
            open(f"/proc/{pid}/task/{tid}/children", "rb") as lists,
        ):
            found += [int(p) for p in lists.read().split()]
    return found


def descendant_pids(
    pid: int, skip: frozenset[int] = frozenset(), limit: int = MAX_DESCENDANTS
) -> list[int]:
    """Every process below ``pid``, breadth first, at most ``limit``; not below ``skip``."""
    found: list[int] = []
    level = [pid]
    while level and len(found) < limit:
        level = [c for p in level for c in child_pids(p) if c not in skip][: limit - len(found)]
        found += level
    return found


@dataclass(frozen=True)
class TreeRates:
    """What a process's descendants did over one window, a second: ``io`` bytes read and
    written, ``disk`` bytes to and from storage, ``cpu`` cores they ran on or waited for
    (``counters.CHILDREN_CPU_FLOOR``); ``count`` of them seen."""

    io: float = 0.0
    disk: float = 0.0
    cpu: float = 0.0
    count: int = 0


@dataclass
class TreeMeter:
    """One process's descendants, their readings at the start of the current window."""

    root: int
    base: dict[int, Counters] = field(default_factory=dict)
    handles: dict[int, psutil.Process] = field(default_factory=dict)
    cpu: dict[int, float] = field(default_factory=dict)  # each one's cores, last window

    def window(self, now: float, parts: frozenset[int] = frozenset()) -> TreeRates:
        """Close the window at ``now``: the descendants' rates since its start (those first
        seen now only start counting). ``parts`` are processes judged on their own (an AReaL
        worker below its controller, an inference server below its rollout worker): they and
        what is below them are theirs, not the root's."""
        io = disk = cpu = 0.0
        alive = descendant_pids(self.root, parts)
        for pid in alive:
            reading = self._read(pid, now)
            if reading is None:
                continue
            before = self.base.get(pid)
            self.base[pid] = reading
            found = rates(before, reading) if before is not None else None
            if found:
                io, disk = io + found.get("io", 0.0), disk + found.get("disk", 0.0)
                wanted = max(found["cpu"], found.get("demand", 0.0))
                cpu += wanted
                self.cpu[pid] = wanted
        for pid in set(self.base) - set(alive):
            del self.base[pid]
            self.handles.pop(pid, None)
            self.cpu.pop(pid, None)
        return TreeRates(io, disk, cpu, len(self.base))

    def pids(self) -> list[int]:
        return sorted(self.base)

    def _read(self, pid: int, now: float) -> Counters | None:
        handle = self.handles.get(pid)
        if handle is None:
            try:
                handle = self.handles[pid] = psutil.Process(pid)
            except psutil.Error:
                return None
        return read_counters(handle, now)


def describe_children(
    pids: list[int], cpu: dict[int, float], timeout: float, waited: bool
) -> list[dict[str, Any]]:
    """What each descendant is doing, for a report: its command line, state, kernel wait and,
    where it matters (the process waits for a child, or the child is stuck on a file or
    works) and py-spy reads it (a Python child), its innermost frames. Dumped in parallel,
    each under ``timeout``: an idle DataLoader worker is listed, never suspended for a stack."""
    shown = pids[:CHILDREN_SHOWN]
    with ThreadPoolExecutor(max_workers=max(1, len(shown))) as pool:
        found = pool.map(lambda pid: _child(pid, cpu.get(pid), timeout, waited), shown)
        return [entry for entry in found if entry is not None]


def _child(pid: int, cpu: float | None, timeout: float, waited: bool) -> dict[str, Any] | None:
    try:
        handle = psutil.Process(pid)
        argv, parent = handle.cmdline(), handle.ppid()
    except psutil.Error:
        return None
    waits = kernel_waits(pid)
    entry: dict[str, Any] = {
        "pid": pid,
        "parent_pid": parent,
        "command": " ".join(argv)[:COMMAND_CHARS],
        "state": waits[0].state if waits else "?",
        "kernel_wait": waits[0].to_dict() if waits else None,
        "frames": [],
    }
    if cpu is not None:
        entry["cpu_utilization"] = round(cpu, 3)
    stuck = bool(waits) and waits[0].stuck
    if not (waited or stuck or (cpu or 0.0) >= CHILDREN_CPU_FLOOR):
        return entry
    try:
        threads = dump_pyspy(pid, timeout, nonblocking=stuck)
    except StackError:
        return entry
    busiest = next((t for t in threads if t.active), threads[0] if threads else None)
    if busiest is not None:
        entry["frames"] = [
            {"name": f.name, "file": f.filename, "line": f.line}
            for f in busiest.frames[:CHILD_FRAMES]
        ]
    return entry
