"""Rollout-side evidence of one node: the pending asyncio tasks of the job's processes and a
probe of every inference server they talk to.

The two run in parallel, each under ``timeout``. Server addresses are read from the processes'
own environment (``AREAL_LLM_SERVER_ADDRS``, exported by AReaL's SPMD launcher and by our
launcher), from the servers' own command lines (single-controller AReaL records them nowhere
else) and from the addresses pending tasks await. An awaited address is listed only when it is
an inference server: AReaL's controller also awaits its workers' RPC servers (``rpc_server
--port P``), which answer ``/health`` and nothing an engine answers.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil

from areal_watchdog.evidence.listeners.tasks import collect
from areal_watchdog.evidence.rollout_side.servers import probe_all, serves_inference
from areal_watchdog.rundir.layout import RunLayout

ENV_SERVER_ADDRS = "AREAL_LLM_SERVER_ADDRS"


def configured_servers(pids: list[int]) -> list[str]:
    """The inference servers the job's processes were told about, in first-seen order."""
    found: dict[str, None] = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error, OSError):
            for addr in psutil.Process(pid).environ().get(ENV_SERVER_ADDRS, "").split(","):
                if addr.strip():
                    found[addr.strip()] = None
    return list(found)


def gather_rollout(
    layout: RunLayout, pids: list[int], running: list[str], timeout: float
) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
    """(task dumps by pid, server probes): the servers the processes were told about, the
    ones found ``running`` here, and those a pending task awaits."""
    addresses = list(dict.fromkeys([*configured_servers(pids), *running]))
    with ThreadPoolExecutor(max_workers=2) as pool:
        tasks_future = pool.submit(collect, layout, pids, timeout)
        probes = probe_all(addresses, min(2.0, timeout))
        dumps = tasks_future.result()
    awaited = {
        t["awaiting"]
        for dump in dumps.values()
        for t in dump.get("tasks", [])
        if t.get("awaiting") and t["awaiting"] not in addresses
    }
    probes += [p for p in probe_all(sorted(awaited), min(2.0, timeout)) if serves_inference(p)]
    return dumps, probes
