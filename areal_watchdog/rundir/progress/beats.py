"""Heartbeats as file names: ``heartbeats/<node>/rank_<r>.step_<s>.<run id>``.

A follower watches its node's ranks once per status period. Opening a heartbeat file per rank
(and a pause file per rank, most often absent) cost two path operations per rank each time on
the shared filesystem; the step and run id in the name make it one directory listing per node,
whatever the number of ranks. A rank moves its name on (one ``rename``, atomic: a listing sees
the old name or the new one) only when its step changes. An announced pause is a file of its own
(``pause_rank_<r>.json``: until when, why), opened only while the listing shows it. Writer and
reader name the directory alike (``beats_node``).
"""

from __future__ import annotations

import os
import re
import socket

from areal_watchdog.rundir.layout import node_of

_BEAT = re.compile(r"rank_(\d+)\.step_(-?\d+|none)\.(\S+)")


def beats_node() -> str:
    """The heartbeat directory of the processes here: the node Slurm or our launcher names,
    else the host (a Ray worker: every sidecar on the host then reads the host's ranks, whose
    steps and pauses count job-wide anyway)."""
    return node_of(os.environ, socket.gethostname())


def beat_name(rank: int, step: int | None, run_id: str) -> str:
    return f"rank_{rank}.step_{'none' if step is None else step}.{run_id}"


def beat_step(name: str, run_id: str) -> int | None:
    """The step a heartbeat name of run ``run_id`` carries (None: not one, or no step)."""
    match = _BEAT.fullmatch(name)
    if match is None or match[3] != run_id or match[2] == "none":
        return None
    return int(match[2])


def pause_name(rank: int) -> str:
    return f"pause_rank_{rank}.json"
