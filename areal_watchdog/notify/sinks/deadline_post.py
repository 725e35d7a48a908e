"""One POST with a total deadline, for every sink's delivery (``notify/delivery.py``) and
Slack's file upload (``slack/upload.py``): a receiver that trickles one byte at a time never
holds the sidecar."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

GRACE = 1.0  # seconds past a sink's timeout before an attempt is abandoned


def post_within(timeout: float, url: str, body: bytes, headers: dict[str, str]) -> Any:
    """POST with ``timeout`` as a total deadline: requests' own timeout is per read, so a
    receiver that trickles one byte at a time would hold it forever. On the deadline the
    attempt's sockets are shut under the worker thread, which then ends too."""
    session, opened = _tracking_session()
    result: dict[str, Any] = {}

    def attempt() -> None:
        try:
            result["response"] = session.post(
                url, data=body, headers=headers, timeout=(min(5.0, timeout), timeout),
                allow_redirects=False,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - handed to the caller below
            result["error"] = exc

    worker = threading.Thread(target=attempt, name="areal-watchdog-post", daemon=True)
    worker.start()
    worker.join(timeout + GRACE)  # requests' own timeouts, with better messages, come first
    late = worker.is_alive()
    if late:
        for conn in opened:
            with contextlib.suppress(OSError, AttributeError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        worker.join(GRACE)
    session.close()
    if late:
        raise requests.Timeout(f"no complete answer within {timeout:g} s")
    error = result.get("error")
    if error is not None:
        raise (
            error
            if isinstance(error, requests.RequestException)
            else requests.RequestException(str(error))
        )
    return result["response"]


def _tracking_session() -> tuple[requests.Session, list[Any]]:
    """A session whose pools remember every connection they open (to shut them on a deadline).
    Proxied requests go through requests' proxy manager and are only abandoned, not shut."""
    opened: list[Any] = []

    def tracking(base: type) -> type:
        class Pool(base):  # type: ignore[misc, valid-type]
            def _new_conn(self) -> Any:
                conn = super()._new_conn()
                opened.append(conn)
                return conn

        return Pool

    adapter = HTTPAdapter(max_retries=0)
    adapter.poolmanager.pool_classes_by_scheme = {
        "http": tracking(HTTPConnectionPool),
        "https": tracking(HTTPSConnectionPool),
    }
    session = requests.Session()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session, opened
