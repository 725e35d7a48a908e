"""What a look knows of one process's movement: its counters at the look, the rate windows of
the polls before it, the bytes it carried over TCP, and how long it sat blocked in the kernel.

One typed record from the sidecar's node watch (``watch/processes/node_watch.py`` builds it from
``evidence.kernel_readings.counters``, ``evidence.process_tree`` and
``evidence.kernel_readings.sockets``) to the rules that judge it (``diagnose.movement``: busy I/O,
children at work, TCP; ``diagnose.patterns.storage``: a kernel wait with nothing moving). It crosses
nodes inside ``RankEvidence`` as its dict.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NamedTuple

from areal_watchdog.evidence.kernel_readings.counters import Counters, children_work, real_data

ROUNDING = 3  # digits a window's values keep: what crosses nodes stays small


class IoWindow(NamedTuple):
    """One poll window's rates, a second. The bytes are the process's own and its descendants'
    together, less what it wrote to its own logs (a log flood is no work)."""

    end: float  # Unix seconds
    io: float  # bytes read and written (rchar + wchar)
    disk: float  # bytes to and from storage
    # cores its descendants wanted (``evidence.kernel_readings.counters.CHILDREN_CPU_FLOOR``)
    children_cpu: float
    logged: float = 0.0  # bytes it wrote to its own stdout, stderr and log files

    @property
    def real_data(self) -> bool:
        return real_data(self.io, self.disk)

    @property
    def children_work(self) -> bool:
        return children_work(self.children_cpu)

    @property
    def at_work(self) -> bool:
        """Work that is movement: real data read or written, or its descendants burning CPU."""
        return self.real_data or self.children_work

    def rounded(self) -> IoWindow:
        return IoWindow(*(round(v, ROUNDING) for v in self))


@dataclass(frozen=True)
class ProcessMovement:
    """One process at one look (``counters.at``)."""

    counters: Counters
    io_windows: tuple[IoWindow, ...] = ()
    # carried over its TCP sockets so far (``evidence.kernel_readings.sockets``)
    tcp_bytes: int | None = None
    kernel_blocked_s: float = 0.0  # blocked in the kernel with nothing moving, at every poll

    @property
    def at(self) -> float:
        return self.counters.at

    @classmethod
    def from_dict(cls, data: object) -> ProcessMovement | None:
        """The record ``data`` holds (its ``evidence.model.plain`` form, as sent between
        nodes); None when it holds none."""
        if not isinstance(data, dict) or not isinstance(data.get("counters"), dict):
            return None
        known = {f.name for f in fields(Counters)}
        try:
            counters = Counters(**{k: v for k, v in data["counters"].items() if k in known})
            windows = tuple(IoWindow(*map(float, w)) for w in data.get("io_windows") or ())
        except (TypeError, ValueError):
            return None
        carried = data.get("tcp_bytes")
        blocked = data.get("kernel_blocked_s")
        return cls(
            counters,
            windows,
            carried if isinstance(carried, int) else None,
            float(blocked) if isinstance(blocked, (int, float)) else 0.0,
        )
