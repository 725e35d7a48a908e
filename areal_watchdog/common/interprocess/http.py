"""HTTP to the job's own inference servers: straight to them, never through a proxy the
environment names (a cluster's ``HTTP_PROXY`` would send loopback traffic away), and one
spelling of a server given on the command line."""

from __future__ import annotations

import urllib.request

from areal_watchdog.common.errors import UserError

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def server_address(url: str) -> str:
    """``host:port`` from ``--server``'s ``host:port`` or ``http://host:port/``; anything else
    is refused in one line."""
    address = url.split("://", 1)[-1].rstrip("/")
    if not address or "/" in address:
        raise UserError(f"--server {url}: give host:port or http://host:port")
    return address
