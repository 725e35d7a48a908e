"""The cheap hang sensor's reading: each rank's collectives in flight, asked between looks
through the Flight Recorder listener every watched rank runs (``rank.flight_recorder``).

A rank asked ``active:<id>`` writes only its entries not yet retired (a few, not the whole
ring buffer) to ``flight_recorder/fr_active_rank_<r>.json``. A rank that does not answer within
the short timeout (stopped, or holding the GIL) is simply absent: the rule reads its CPU."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from areal_watchdog.common.atomic import read_json
from areal_watchdog.common.interprocess.backoff import looks
from areal_watchdog.common.interprocess.fifo import write_fifos
from areal_watchdog.rundir.layout import FR_ACTIVE, RunLayout

SENSE_TIMEOUT = 0.3  # seconds a poll waits for the ranks' answers, at most


@dataclass(frozen=True)
class InFlight:
    """One collective a rank has issued and not seen complete."""

    pg: str  # the process group's id
    seq: int  # its collective sequence number in that group
    op: str  # ``gloo:all_reduce``, ``nccl:broadcast``...
    since: float  # when the rank issued it (its wall clock, seconds)

    def to_list(self) -> list[object]:
        return [self.pg, self.seq, self.op, round(self.since, 3)]

    @classmethod
    def from_list(cls, item: list[object]) -> InFlight:
        pg, seq, op, since = item
        return cls(str(pg), int(seq), str(op), float(since))  # type: ignore[arg-type]


def sense(
    layout: RunLayout, ranks: list[int], timeout: float = SENSE_TIMEOUT
) -> dict[int, list[InFlight]]:
    """Each answering rank's collectives in flight (point-to-point operations left out: their
    sequence numbers are per pair, not per group)."""
    request = f"{FR_ACTIVE}{os.getpid()}-{time.time_ns()}"
    asked = write_fifos({rank: layout.fr_trigger(rank) for rank in ranks}, request, grace=0)
    answers: dict[int, list[InFlight]] = {}
    for _ in looks(timeout if asked else 0):
        for rank in asked - answers.keys():
            record = read_json(layout.fr_active(rank))
            if isinstance(record, dict) and record.get("request") == request:
                answers[rank] = _collectives(record.get("trace"))
        if len(answers) == len(asked):
            break
    return answers


def _collectives(trace: object) -> list[InFlight]:
    entries = trace.get("entries") if isinstance(trace, dict) else None
    found = []
    for entry in entries or []:
        try:
            if entry.get("is_p2p"):
                continue
            found.append(InFlight(str(entry["pg_id"]), int(entry["collective_seq_id"]),
                                  str(entry["profiling_name"]),
                                  int(entry["time_created_ns"]) / 1e9))  # fmt: skip
        except (AttributeError, KeyError, TypeError, ValueError):
            continue  # a rank's odd entry is no reading, never an error
    return found
