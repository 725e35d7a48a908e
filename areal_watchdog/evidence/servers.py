"""Probe the job's inference servers (SGLang's HTTP API): alive, healthy, busy, paused.

Only read-only GET endpoints are used (``/health``, ``/get_server_info``, ``/metrics``), each
with a short timeout, so a probe never changes a server's state and a wedged server costs at
most ``timeout`` seconds per endpoint. Addresses come from ``AREAL_LLM_SERVER_ADDRS``, from
AReaL's name_resolve records or from the processes found; probes run in parallel.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_METRIC = re.compile(r"^(sglang[:_][a-z_]+)(?:\{[^}]*\})?\s+([-+0-9.eE]+|NaN)\s*$", re.M)
_METRICS = {
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "queued",
    "sglang:gen_throughput": "gen_throughput",
    "sglang:is_paused": "paused",
}


def probe_all(addresses: list[str], timeout: float = 2.0) -> list[dict[str, Any]]:
    """One probe per address, in parallel, in the order given."""
    if not addresses:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(addresses))) as pool:
        return list(pool.map(lambda a: probe(a, timeout), addresses))


def probe(address: str, timeout: float = 2.0) -> dict[str, Any]:
    """What one server answers; ``state`` is up | unreachable | unresponsive | unhealthy."""
    result: dict[str, Any] = {"address": address, "time": time.time()}
    status, body, took = _get(address, "/health", timeout)
    result["health_s"] = took
    if status is None:
        result["state"] = "unreachable" if body == "refused" else "unresponsive"
        result["error"] = body
        return result
    result["health_status"] = status
    result["state"] = "up" if status == 200 else "unhealthy"
    result.update(_server_info(address, timeout))
    result.update(_metrics(address, timeout))
    return result


def _server_info(address: str, timeout: float) -> dict[str, Any]:
    status, body, _ = _get(address, "/get_server_info", timeout)
    if status != 200:
        return {}
    try:
        info = json.loads(body)
    except ValueError:
        return {}
    found: dict[str, Any] = {}
    states = info.get("internal_states") if isinstance(info, dict) else None
    state = states[0] if isinstance(states, list) and states else info
    if isinstance(state, dict):
        for key in ("last_gen_throughput", "gen_throughput"):
            if isinstance(state.get(key), (int, float)):
                found["gen_throughput"] = float(state[key])
        for key in ("paused", "is_paused"):
            if isinstance(state.get(key), bool):
                found["paused"] = state[key]
    return found


def _metrics(address: str, timeout: float) -> dict[str, Any]:
    status, body, _ = _get(address, "/metrics", timeout)
    if status != 200:
        return {}
    found: dict[str, Any] = {}
    for name, value in _METRIC.findall(body[:200_000]):
        key = _METRICS.get(name.replace("_", ":", 1) if name.startswith("sglang_") else name)
        if key and value != "NaN":
            number = float(value)
            found[key] = bool(number) if key == "paused" else number
    return found


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


def _get(address: str, path: str, timeout: float) -> tuple[int | None, str, float]:
    """(HTTP status or None, body or the reason, seconds): never raises."""
    url = f"http://{address}{path}"
    started = time.perf_counter()
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            body = response.read(1_000_000).decode(errors="replace")
            return response.status, body, round(time.perf_counter() - started, 4)
    except urllib.error.HTTPError as exc:
        return exc.code, "", round(time.perf_counter() - started, 4)
    except ConnectionRefusedError:
        return None, "refused", round(time.perf_counter() - started, 4)
    except (TimeoutError, urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        kind = "refused" if isinstance(reason, ConnectionRefusedError) else f"{reason}"[:200]
        return None, kind, round(time.perf_counter() - started, 4)
