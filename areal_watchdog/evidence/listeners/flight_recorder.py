"""Capture PyTorch Flight Recorder traces from every rank of a node, on demand (the sidecar's
side; the rank's listener is ``rank.flight_recorder``).

Two triggers, tried in this order for each rank:

- the cooperative listener every watched rank runs: a daemon thread blocked on a per-rank FIFO
  (``flight_recorder/trigger_rank_<r>``); a write wakes it at once and it writes
  ``torch._C._distributed_c10d._dump_fr_trace_json()`` to ``flight_recorder/fr_rank_<r>.json``.
  A blocked collective releases the GIL, so this answers while the main thread waits (gloo and
  NCCL alike);
- NCCL's own dump pipe (``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``, exported by the launcher as
  ``flight_recorder/pipe_rank_<r>``): a write makes ProcessGroupNCCL dump to
  ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` (``flight_recorder/rank_<r>``), a pickle read here with an
  unpickler that only accepts plain containers and values.

Missing or unreadable traces are simply absent from the result; the classifier then falls back
to stacks only.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import time
from typing import Any

from areal_watchdog.common.atomic import read_json
from areal_watchdog.common.interprocess.backoff import looks
from areal_watchdog.common.interprocess.fifo import write_fifos
from areal_watchdog.rundir.layout import RunLayout

_KEPT = (
    "collective_seq_id",
    "profiling_name",
    "input_sizes",
    "input_dtypes",
    "output_sizes",
    "output_dtypes",
    "process_group",
    "pg_id",
    "is_p2p",
    "retired",
    "state",
)


# -------------------------------------------------------------------------- sidecar side
def collect(layout: RunLayout, ranks: list[int], timeout: float) -> dict[int, dict[str, Any]]:
    """Ask every listed rank for its trace; return the traces that arrive within ``timeout``.
    Only ranks a trigger reached are waited for (a rank with neither listener, or a filesystem
    without FIFOs, cost the whole timeout and ten lookups a rank for nothing)."""
    request = f"{os.getpid()}-{time.time_ns()}"
    asked = write_fifos({rank: layout.fr_trigger(rank) for rank in ranks}, request)
    pipes = {rank: layout.nccl_pipe(rank) for rank in ranks if rank not in asked}
    asked_nccl = write_fifos(pipes, "1")
    asked |= asked_nccl
    traces: dict[int, dict[str, Any]] = {}
    for _ in looks(timeout if asked else 0):
        if len(traces) == len(asked):
            break
        for rank in asked:
            if rank in traces:
                continue
            trace = (
                _nccl_trace(layout, rank)
                if rank in asked_nccl
                else _listener_trace(layout, rank, request)
            )
            if trace is not None:
                traces[rank] = strip(trace)
    return traces


def _listener_trace(layout: RunLayout, rank: int, request: str) -> dict[str, Any] | None:
    record = read_json(layout.fr_dump(rank))
    if not isinstance(record, dict) or record.get("request") != request:
        return None
    if isinstance(record.get("trace"), dict):
        return record["trace"]
    return {"error": str(record.get("error") or "no trace")}  # answered: no need to wait


def _nccl_trace(layout: RunLayout, rank: int) -> dict[str, Any] | None:
    try:
        return parse_trace(layout.nccl_dump(rank).read_bytes())
    except OSError:
        return None


# ------------------------------------------------------------------------------ parsing
def parse_trace(data: bytes) -> dict[str, Any] | None:
    """One rank's trace from a dump file's bytes, or None when it is not one.

    Accepts a pickle (what ``TORCH_NCCL_DUMP_ON_TIMEOUT``, NCCL's dump pipe and
    ``_dump_fr_trace()`` write), raw ``_dump_fr_trace_json()`` output, and the listener's record
    (``{"rank", "trace"}``); full or ``onlyActive``."""
    try:
        if data[:1] == b"\x80":
            trace = _PlainUnpickler(io.BytesIO(data)).load()
        else:
            trace = json.loads(data.decode("utf-8"))
    except (
        pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
        RecursionError,
    ):  # fmt: skip
        return None
    if isinstance(trace, dict) and isinstance(trace.get("trace"), dict):
        trace = trace["trace"]
    if not isinstance(trace, dict) or not ("entries" in trace or "pg_status" in trace):
        return None  # not a trace: a listener's error record, some other JSON
    return trace if isinstance(trace.get("entries", []), list) else None


_PLAIN_TYPES = {
    ("builtins", name) for name in ("set", "frozenset", "list", "dict", "tuple", "bytearray")
} | {("collections", "OrderedDict")}


class _PlainUnpickler(pickle.Unpickler):
    """Containers, strings and numbers only: a dump file cannot run code here."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _PLAIN_TYPES:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing {module}.{name} in a Flight Recorder dump")


def strip(trace: dict[str, Any]) -> dict[str, Any]:
    """What the analysis needs (no stack frames): a few hundred bytes per collective. A rank
    that answered without a trace keeps only its ``error``; a trace with no entries is a
    rank that issued no collective yet (one held by the GIL, or behind), not a missing dump."""
    if "entries" not in trace and "pg_status" not in trace:
        return {"error": str(trace.get("error") or "not a trace")}
    entries = [e for e in trace.get("entries") or [] if isinstance(e, dict)]
    return {
        "version": trace.get("version"),
        "pg_status": trace.get("pg_status") or {},
        "pg_config": trace.get("pg_config") or {},
        "entries": [{k: e.get(k) for k in _KEPT} for e in entries],
    }
