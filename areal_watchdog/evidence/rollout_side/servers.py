"""Probe the job's inference servers (SGLang's and vLLM's HTTP APIs): alive, healthy, busy,
paused, updating weights, and how much it has generated (the counters a second look compares).

Only read-only GET endpoints are used, each with a short timeout, so a probe never changes a
server's state and a wedged server costs at most ``timeout`` seconds per endpoint: ``/health``,
then SGLang's ``/get_server_info``, then ``/metrics`` (its metric names tell SGLang from vLLM),
then for vLLM ``/is_paused`` (vLLM 0.32 answers it when started with ``VLLM_SERVER_DEV_MODE=1``;
AReaL's own pause gate in ``areal_vllm_server`` is not exposed by any endpoint: the rollout rules
infer it, ``diagnose/rollout_rules/rollout.py``). Addresses come from ``AREAL_LLM_SERVER_ADDRS``,
from AReaL's name_resolve records or from the processes found; probes run in parallel.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from areal_watchdog.common.interprocess.http import OPENER

_METRIC = re.compile(r"^((?:sglang|vllm)[:_][a-z_]+)(?:\{[^}]*\})?\s+([-+0-9.eE]+|NaN)\s*$", re.M)
_METRICS = {
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "queued",
    "sglang:gen_throughput": "gen_throughput",
    "sglang:is_paused": "paused",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "queued",
    "vllm:rl_weight_update_operations_in_flight": "updating_weights",  # summed over operations
    # Counters: what the server did between two looks is the work it does (``diagnose.movement``).
    "sglang:generation_tokens_total": "generated_tokens",
    "sglang:num_requests_total": "requests_done",
    "vllm:generation_tokens_total": "generated_tokens",
    "vllm:request_success_total": "requests_done",  # summed over finish reasons
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
    if result.get("engine") == "vllm":
        result.update(_vllm_paused(address, timeout))
    return result


# What every probe holds; anything more came from an engine's own endpoints (servers.probe).
PROBE_BASICS = frozenset({"address", "time", "health_s", "health_status", "state", "error"})


def serves_inference(probe: dict[str, Any]) -> bool:
    """An address a task awaits is an inference server when its probe learned something only an
    engine answers (SGLang's ``/get_server_info``, SGLang's or vLLM's ``/metrics``), or when it
    did not answer at all: a dead server cannot say what it was. Anything else that answers
    ``/health`` (an AReaL worker's RPC server) is not one."""
    return probe.get("health_status") is None or bool(set(probe) - PROBE_BASICS)


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
        name = name if ":" in name else name.replace("_", ":", 1)
        found.setdefault("engine", name.split(":", 1)[0])
        key = _METRICS.get(name)
        if key and value != "NaN":
            number = float(value)
            if key == "paused":
                found[key] = bool(number)
            else:  # a metric with several label sets (vLLM's per operation) adds up
                found[key] = found.get(key, 0.0) + number
    return found


def _vllm_paused(address: str, timeout: float) -> dict[str, Any]:
    """vLLM's own pause state (``GET /is_paused``, dev mode); nothing when it is not served."""
    status, body, _ = _get(address, "/is_paused", timeout)
    if status != 200:
        return {}
    try:
        paused = json.loads(body).get("is_paused")
    except (ValueError, AttributeError):
        return {}
    return {"paused": paused} if isinstance(paused, bool) else {}


def _get(address: str, path: str, timeout: float) -> tuple[int | None, str, float]:
    """(HTTP status or None, body or the reason, seconds): never raises."""
    url = f"http://{address}{path}"
    started = time.perf_counter()
    try:
        with OPENER.open(url, timeout=timeout) as response:
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
