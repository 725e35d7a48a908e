"""The job's calls to its inference servers, read from the kernel's TCP sockets: which server
a process of the job sent a request to and has heard nothing from since.

A weight update or a generation call goes out over a TCP connection, from whichever process
makes it (AReaL sends a disk weight update from a process-pool child of the rollout worker,
a distributed one from rank 0's HTTP thread). The kernel keeps, for each socket, how long ago
data was last sent (``lastsnd``) and last received (``lastrcv``): a socket that sent after it
last received waits for an answer, for ``lastsnd`` so far. One ``ss -tinpH`` filtered on the
servers' addresses lists them with the processes that hold them (about 15 ms here), for any
HTTP client, sync or async, with nothing added to the job. Without ``ss`` nothing is read.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Any

SS_TIMEOUT_S = 2.0
_PID = re.compile(r"pid=(\d+)")
_LAST = re.compile(r"\blast(snd|rcv):(\d+)")
_RECEIVED = re.compile(r"\bbytes_received:(\d+)")
_MAPPED = "[::ffff:"


@dataclass(frozen=True)
class ServerCall:
    """One connection from a process of the job to an inference server, at one reading:
    seconds since it last sent data and since it last received any (None: it never did)."""

    pid: int
    server: str  # host:port
    sent_ago: float
    received_ago: float | None

    @property
    def awaiting(self) -> bool:
        """It sent after it last heard from the server: a request not yet answered."""
        return self.received_ago is None or self.sent_ago < self.received_ago

    @property
    def answered_in(self) -> float:
        """For an answered call, how long its answer took (its last receive after its last
        send); 0 for one still awaited."""
        if self.received_ago is None or self.awaiting:
            return 0.0
        return max(0.0, self.sent_ago - self.received_ago)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_server_calls(pids: set[int], servers: list[str]) -> list[ServerCall]:
    """The connections ``pids`` hold to ``servers`` (``host:port``) now; empty when ``ss`` is
    not there or fails."""
    ss = shutil.which("ss")
    if ss is None or not pids or not servers:
        return []
    peers = " or ".join(f"dst {address}" for address in servers)
    try:
        output = subprocess.run([ss, "-tinpH", *peers.split()], capture_output=True, text=True,
                                timeout=SS_TIMEOUT_S, check=False).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_server_calls(output, pids, servers)


def parse_server_calls(output: str, pids: set[int], servers: list[str]) -> list[ServerCall]:
    """``ss -tinpH``'s established sockets (a line naming the addresses and processes, then an
    indented line of numbers) from one of ``pids`` to one of ``servers``."""
    found: list[ServerCall] = []
    wanted = set(servers)
    owners: list[int] = []
    server = ""
    for line in output.splitlines():
        if not line[:1].isspace():
            fields = line.split()
            peer = _plain(fields[4]) if len(fields) > 4 and fields[0] == "ESTAB" else ""
            server = peer if peer in wanted else ""
            owners = [int(p) for p in _PID.findall(line) if int(p) in pids] if server else []
            continue
        last = {kind: int(ms) / 1000 for kind, ms in _LAST.findall(line)}
        heard = last.get("rcv") if _RECEIVED.search(line) else None  # ss omits a zero count
        if owners and "snd" in last:
            found += [ServerCall(pid, server, last["snd"], heard) for pid in owners]
        owners = []
    return found


def _plain(address: str) -> str:
    """``[::ffff:127.0.0.1]:30000`` as ``127.0.0.1:30000``; other addresses as they are."""
    if address.startswith(_MAPPED):
        host, _, port = address[len(_MAPPED) :].partition("]:")
        return f"{host}:{port}"
    return address
