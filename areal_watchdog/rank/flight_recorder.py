"""The rank's side of the Flight Recorder capture: a listener thread that dumps this process's
trace when the sidecar asks (``evidence.listeners.flight_recorder`` asks and collects).

A daemon thread blocks on a per-rank FIFO (``flight_recorder/trigger_rank_<r>``, mode 0600);
a write wakes it and it writes ``torch._C._distributed_c10d._dump_fr_trace_json()`` to
``flight_recorder/fr_rank_<r>.json`` (or, asked ``active:<id>`` by the sensor between looks,
only the entries in flight to ``fr_active_rank_<r>.json``). A blocked collective releases the
GIL, so this answers while the main thread (or AReaL's EngineWorker) waits. Nothing imports
torch until a dump.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import write_text_atomic
from areal_watchdog.rundir.layout import FR_ACTIVE, RunLayout

ENV_FLIGHT_RECORDER = "AREAL_WATCHDOG_FLIGHT_RECORDER"  # "1": ranks start the listener


def start_listener(layout: RunLayout, rank: int) -> None:
    """Create the rank's trigger FIFO and a daemon thread that dumps on every request."""
    path = layout.fr_trigger(rank)
    try:
        layout.flight_recorder_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        os.mkfifo(path, 0o600)
    except OSError:
        return
    threading.Thread(
        target=_listen, args=(layout, rank, path), name="areal-flight-recorder", daemon=True
    ).start()


def _listen(layout: RunLayout, rank: int, path: Path) -> None:
    while True:
        try:
            with open(path, encoding="utf-8") as fifo:  # blocks, without the GIL, until a write
                request = fifo.read().strip()
        except OSError:
            return
        if request:
            _dump(layout, rank, request)


def _dump(layout: RunLayout, rank: int, request: str) -> None:
    """The whole trace, or (a request ``active:<id>``, the sensor's) only what is in flight."""
    active = request.startswith(FR_ACTIVE)
    record: dict[str, Any] = {"request": request, "rank": rank, "time": time.time()}
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised in this rank")
        import torch

        trace = json.loads(torch._C._distributed_c10d._dump_fr_trace_json(onlyActive=active))
        record["trace"] = _in_flight(trace) if active else trace
    except Exception as exc:  # noqa: BLE001 - report why, never disturb the rank
        record["error"] = f"{type(exc).__name__}: {exc}"[:300]
    target = layout.fr_active(rank) if active else layout.fr_dump(rank)
    with contextlib.suppress(OSError):
        write_text_atomic(target, json.dumps(record))


def _in_flight(trace: dict[str, Any]) -> dict[str, Any]:
    """The entries not retired yet, with only what the sensor reads (gloo's ``onlyActive``
    keeps every entry: its work is never marked completed, only retired)."""
    kept = ("collective_seq_id", "pg_id", "profiling_name", "is_p2p", "time_created_ns")
    entries = [e for e in trace.get("entries") or [] if not e.get("retired")]
    return {"entries": [{k: e.get(k) for k in kept} for e in entries]}
