"""A free TCP port on one address, found by binding it: what the launcher gives a sidecar's
metrics endpoint (the sidecar takes another where it was taken meanwhile)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
