"""Bytes each process carried over TCP, for the counters a look reads
(``evidence.kernel_readings.counters``).

``/proc/PID/io`` counts no socket ``send``/``recv`` (measured: a 320 KB/s upload to a slow
endpoint on 127.0.0.1 moved 0 B/s of ``wchar``), so a rank uploading a checkpoint to a slow
HTTP endpoint would look blocked. The kernel keeps each TCP socket's ``bytes_acked`` and
``bytes_received``; one ``ss -tinpH`` (iproute2; about 15 ms here) lists them with the processes
that hold each socket. Without ``ss`` nothing is read: the counters simply lack the field.
"""

from __future__ import annotations

import re
import shutil
import subprocess

SS_TIMEOUT_S = 2.0
_PID = re.compile(r"pid=(\d+)")
_BYTES = re.compile(r"\bbytes_(acked|received):(\d+)")


def tcp_bytes(pids: set[int]) -> dict[int, int]:
    """Bytes acknowledged and received over the TCP sockets each of ``pids`` holds now (a
    socket several processes share counts for each); empty when ``ss`` is not there."""
    ss = shutil.which("ss")
    if ss is None or not pids:
        return {}
    try:
        output = subprocess.run([ss, "-tinpH"], capture_output=True, text=True,
                                timeout=SS_TIMEOUT_S, check=False).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_ss(output, pids)


def parse_ss(output: str, pids: set[int]) -> dict[int, int]:
    """``ss -tinpH``'s sockets (a line naming the processes, then an indented line of numbers)
    summed per process."""
    found: dict[int, int] = {}
    owners: list[int] = []
    for line in output.splitlines():
        if not line[:1].isspace():
            owners = [int(p) for p in _PID.findall(line) if int(p) in pids]
            continue
        carried = sum(int(n) for _, n in _BYTES.findall(line))
        for pid in owners:
            found[pid] = found.get(pid, 0) + carried
        owners = []
    return found
