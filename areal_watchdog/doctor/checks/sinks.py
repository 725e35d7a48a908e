"""Can this node reach every ``watchdog.notify`` sink? Its secrets readable, its host resolved
and a TCP connection opened and closed (through the proxy ``requests`` would use): nothing is
posted, no TLS handshake, no request; details are scrubbed by the project's ``Redactor``."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any
from urllib.parse import urlsplit

from requests.utils import get_environ_proxies

from areal_watchdog.common.secrets.redact import Redactor
from areal_watchdog.config.sinks import SecretError, SinkSpec, resolve
from areal_watchdog.doctor.model import FAIL, PASS, Check
from areal_watchdog.notify.sinks.registry import UnknownSink, sink_for

TIMEOUT = 5.0
SECRET_FIX = "export the variable, or chmod 600 the file, that watchdog.notify names"
NET_FIX = "open egress from this node to {where} (or set HTTPS_PROXY), then run notify-test"


def check_sinks(notify: list[dict[str, Any]]) -> list[Check]:
    if not notify:
        return [Check("notify", PASS, "no sink configured (watchdog.notify)")]
    return [check_sink(SinkSpec.from_dict(item)) for item in notify]


def check_sink(spec: SinkSpec) -> Check:
    """Whichever the sink's type: its secrets read, and its endpoint (the sink says where)
    reached."""
    name = f"notify {spec.name} ({spec.type})"
    try:
        kind = sink_for(spec)
    except UnknownSink as exc:
        return Check(name, FAIL, str(exc), "install the package that provides it")
    try:
        sink = resolve(spec)
    except SecretError as exc:
        return Check(name, FAIL, str(Redactor.from_environment().scrub(str(exc))), SECRET_FIX)
    redactor = Redactor.from_environment(extra=sink.secret_values())
    found = reach(kind.endpoint(sink.values))
    return Check(name, found.status, redactor.scrub(found.detail), redactor.scrub(found.fix))


def target(url: str) -> tuple[str, int, str]:
    """Where a connection for ``url`` goes: ``(host, port, how)``, the proxy's when one is
    set for it. Raises ValueError for a URL that is not http(s) or names no host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("the URL is not http(s)://HOST/...")
    proxy = get_environ_proxies(url).get(parts.scheme)
    if proxy:
        via = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        return via.hostname or "", via.port or 80, f" through the proxy {via.hostname}"
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), ""


def reach(url: str) -> Check:
    """Resolve the host and open (then close) a TCP connection; never send anything."""
    try:
        host, port, how = target(url)
    except ValueError as exc:
        return Check("notify", FAIL, str(exc), "name an http(s) URL in the sink's variable")
    where = f"{host}:{port}"
    started = time.perf_counter()
    try:
        addresses = _resolve(host, port)
    except (OSError, FutureTimeout) as exc:
        return Check(
            "notify",
            FAIL,
            f"cannot resolve {host}{how}: {exc or 'timed out'}",
            NET_FIX.format(where=where),
        )
    try:
        socket.create_connection((host, port), timeout=TIMEOUT).close()
    except OSError as exc:
        return Check(
            "notify", FAIL, f"{where}{how}: no TCP connection: {exc}", NET_FIX.format(where=where)
        )
    took = (time.perf_counter() - started) * 1000
    return Check(
        "notify",
        PASS,
        f"{where}{how}: resolved ({len(addresses)} address(es)) and "
        f"connected in {took:.0f} ms; nothing sent",
    )


def _resolve(host: str, port: int) -> list[Any]:
    """``getaddrinfo`` under a deadline (it has none of its own)."""
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM).result(TIMEOUT)
    finally:
        pool.shutdown(wait=False)
