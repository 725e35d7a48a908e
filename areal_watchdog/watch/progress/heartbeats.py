"""What the rank-side API says (``areal_watchdog.heartbeat(step)``, ``pause(...)``): the highest
step this node's ranks beat and any pause still announced, read from their files."""

from __future__ import annotations

import os
from dataclasses import dataclass

from areal_watchdog.common.atomic import read_json
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.progress.beats import beat_step


@dataclass
class HeartbeatState:
    """What the rank-side API says: the highest step and any pause still announced."""

    max_step: int | None = None
    pause_until: float = 0.0
    pause_reason: str = ""


def read_heartbeats(layout: RunLayout, run_id: str, node: str) -> HeartbeatState:
    """The heartbeats and announced pauses of ``node``'s ranks (``rundir.beats_node``; the
    other nodes' reach the leader through their sidecars' statuses): one listing, a pause file
    opened only when listed."""
    state = HeartbeatState()
    directory = layout.heartbeats(node)
    try:
        names = os.listdir(directory)
    except OSError:
        return state  # no rank of this node uses the heartbeat API
    steps = [s for s in (beat_step(n, run_id) for n in names) if s is not None]
    state.max_step = max(steps, default=None)
    for name in names:
        record = read_json(directory / name) if name.startswith("pause_") else None
        if isinstance(record, dict) and record.get("run_id") == run_id:
            until = float(record.get("until", 0))
            if until > state.pause_until:
                state.pause_until, state.pause_reason = until, str(record.get("reason", ""))
    return state
