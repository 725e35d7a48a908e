"""Loopback ports for the servers tests and benchmarks start."""

from __future__ import annotations

import socket


def free_port_pair() -> int:
    """A port P with P and P+1 free on 127.0.0.1 (the server and the weight-sync store)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port pair")
