"""Each process's own counters: CPU time, bytes through its reads and writes, context switches.

A stack says where a process is; its counters say whether it did anything there. A rank that
writes a checkpoint in one function for a minute has the same stack at two looks, but its
``wchar`` grew by the checkpoint's size; a rank blocked in a collective grows nothing. They are
cheap reads of ``/proc/PID/{stat,io,status}`` (psutil's ``oneshot``), taken at every poll and
every look for every rank and AReaL worker the sidecar knows (``benchmarks/bench_seconds.py``
measures their cost at 8 ranks a node: 0.45 ms a poll).

``read_chars``/``write_chars`` are ``rchar``/``wchar``: every byte through read and write
calls (files, pipes, the page cache). ``read_bytes``/``write_bytes`` are what reached the
storage layer. Sockets' ``send``/``recv`` count in neither: a look reads those from the TCP
sockets themselves (``evidence.kernel_readings.sockets``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import psutil

# Real data, a second: far above what a rank blocked in a collective moves while watched (about
# 0.3 KB/s through read and write calls and 5 KB/s to storage, measured here under the sensor's
# asking: its answers and the heartbeats), far below a checkpoint, a dataset read or a log
# flood's worth of real work (a 1 MB fsync'd chunk every 0.15 s is 6.7 MB/s).
IO_FLOOR = 64 * 1024.0  # bytes read and written a second (rchar + wchar)
DISK_FLOOR = 1024 * 1024.0  # bytes to and from storage a second (read_bytes + write_bytes)


# Cores a process's descendants want while it waits on them: DataLoader workers decoding a
# long document, a compile worker, a checksum of a copy. Its own CPU is no movement (a rank
# spinning forever burns it too); its children's is work it waits for (evidence.process_tree).
# Measured as demand (time on a CPU plus time runnable on a run queue, ``/proc/PID/schedstat``):
# on a node whose cores are all taken a CPU-bound worker gets 0.2 cores but wants 1.
CHILDREN_CPU_FLOOR = 0.3


def real_data(io_rate: float, disk_rate: float) -> bool:
    """A rate window in which the process read or wrote real data (``IO_FLOOR``)."""
    return io_rate >= IO_FLOOR or disk_rate >= DISK_FLOOR


def children_work(children_cpu: float) -> bool:
    """A rate window in which the process's descendants worked (``CHILDREN_CPU_FLOOR``)."""
    return children_cpu >= CHILDREN_CPU_FLOOR


@dataclass(frozen=True)
class Counters:
    """One process's counters at one moment (``at``, Unix seconds); None: not readable here."""

    at: float
    cpu_s: float
    read_chars: int | None = None
    write_chars: int | None = None
    read_bytes: int | None = None
    write_bytes: int | None = None
    switches: int | None = None  # voluntary and involuntary context switches
    runnable_s: float | None = None  # on a CPU or waiting on a run queue for one, all told

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def io_chars(self) -> int | None:
        """Bytes read and written, all together (None: the kernel keeps no I/O accounting)."""
        if self.read_chars is None or self.write_chars is None:
            return None
        return self.read_chars + self.write_chars


def read_counters(handle: psutil.Process, now: float) -> Counters | None:
    """``handle``'s counters now; None once it is gone. A field the kernel or the permissions
    do not give stays None (another user's ``/proc/PID/io`` needs ptrace rights)."""
    try:
        with handle.oneshot():
            times = handle.cpu_times()
            switches = _switches(handle)
            io = _io(handle)
    except psutil.Error:
        return None
    fields = (io.read_chars, io.write_chars, io.read_bytes, io.write_bytes) if io else (None,) * 4
    return Counters(now, times.user + times.system, *fields, switches, _runnable(handle.pid))


def _runnable(pid: int) -> float | None:
    """Seconds ``pid`` ran or waited to run (``schedstat``'s first two fields, nanoseconds);
    None where the kernel keeps no scheduler statistics."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as stats:
            ran, waited = stats.read().split()[:2]
        return (int(ran) + int(waited)) / 1e9
    except (OSError, ValueError):
        return None


def _io(handle: psutil.Process) -> Any:
    try:
        io = handle.io_counters()
    except (psutil.AccessDenied, AttributeError, NotImplementedError):
        return None
    return io if hasattr(io, "read_chars") else None


def _switches(handle: psutil.Process) -> int | None:
    try:
        ctx = handle.num_ctx_switches()
    except (psutil.AccessDenied, NotImplementedError):
        return None
    return ctx.voluntary + ctx.involuntary


def rates(before: Counters, after: Counters) -> dict[str, float] | None:
    """Per second between two readings of one process: ``cpu`` (cores), ``demand`` (cores it
    ran on or waited for), ``io`` (bytes read and written), ``disk`` (bytes to and from
    storage), ``switches``; None when they are not ordered in time. A counter either reading
    lacks is left out."""
    seconds = after.at - before.at
    if seconds <= 0:
        return None
    found = {"cpu": max(0.0, after.cpu_s - before.cpu_s) / seconds}
    pairs = {
        "io": (before.io_chars, after.io_chars),
        "disk": (_sum(before.read_bytes, before.write_bytes),
                 _sum(after.read_bytes, after.write_bytes)),
        "switches": (before.switches, after.switches),
        "demand": (before.runnable_s, after.runnable_s),
    }  # fmt: skip
    for name, (old, new) in pairs.items():
        if old is not None and new is not None:
            found[name] = max(0, new - old) / seconds
    return found


def _sum(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b
