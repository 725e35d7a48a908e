"""What a process writes to its own logs, apart from its real data: a retry loop that logs every
failure moves bytes through ``write()`` as a checkpoint does, but a log flood is no work.

A process's log outputs are its stdout and stderr when they are regular files (torchrun's
``--redirects``/``--tee`` puts each rank's there) and any file it holds open whose name ends in
``.log``, ``.out`` or ``.err``. What it wrote to them is the growth of each descriptor's file
position (``/proc/PID/fdinfo/FD``: an appending write moves it), read from ``/proc`` only, never
from the file or its filesystem. Writes to a pipe (a process whose output a launcher copies)
cannot be told apart this way: they stay in its bytes.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

LOG_SUFFIXES = (".log", ".out", ".err")
RESCAN_EVERY = 10  # windows between looks through every descriptor (a log opened later)
MAX_FDS = 4096  # a process with more descriptors is read for stdout and stderr only


def log_fds(pid: int) -> list[int]:
    """The process's log descriptors: stdout and stderr on regular files, and files named
    like logs."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    found = []
    for name in fds if len(fds) <= MAX_FDS else ["1", "2"]:
        with contextlib.suppress(OSError, ValueError):
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            fd = int(name)
            if target.startswith("/") and (fd in (1, 2) or target.endswith(LOG_SUFFIXES)):
                found.append(fd)
    return sorted(found)


def position(pid: int, fd: int) -> int | None:
    """The descriptor's file position (``pos:`` of its fdinfo); None when it is closed."""
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("pos:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class LogMeter:
    """One process's log descriptors and their positions at the start of the current window."""

    pid: int
    fds: list[int] = field(default_factory=list)
    positions: dict[int, int] = field(default_factory=dict)
    windows: int = 0

    def window(self) -> int:
        """Bytes written to its logs since the last window (0 at the first)."""
        if self.windows % RESCAN_EVERY == 0:
            self.fds = log_fds(self.pid)
        self.windows += 1
        written = 0
        now = {}
        for fd in self.fds:
            pos = position(self.pid, fd)
            if pos is None:
                continue
            now[fd] = pos
            before = self.positions.get(fd)
            if before is not None and pos >= before:  # a truncated log starts again
                written += pos - before
        self.positions = now
        return written
