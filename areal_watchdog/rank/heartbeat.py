"""Rank-side progress API: cheap heartbeats and announced pauses, no-ops without a watchdog."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from areal_watchdog.common.atomic import write_json_atomic
from areal_watchdog.rundir.layout import ENV_RUN_ID, ENV_WATCH_DIR, RunLayout

_MIN_REWRITE_INTERVAL = 1.0  # seconds between two writes that carry the same step


class _Beacon:
    """Where this process writes its heartbeats; resolved once from the environment."""

    def __init__(self) -> None:
        watch_dir = os.environ.get(ENV_WATCH_DIR)
        self.rank = int(os.environ.get("RANK", "0"))
        self.run_id = os.environ.get(ENV_RUN_ID, "")
        self.layout = RunLayout(Path(watch_dir).parent) if watch_dir else None
        self.last_step: int | None = None
        self.last_write = 0.0

    def beat(self, step: int | None) -> None:
        if self.layout is None:
            return
        now = time.time()
        if step == self.last_step and now - self.last_write < _MIN_REWRITE_INTERVAL:
            return
        record = {"run_id": self.run_id, "rank": self.rank, "step": step, "time": now}
        try:
            write_json_atomic(self.layout.heartbeat(self.rank), record)
        except OSError:
            return  # the watchdog observes; it never breaks training
        self.last_step, self.last_write = step, now

    def pause(self, seconds: float, reason: str) -> Path | None:
        if self.layout is None:
            return None
        path = self.layout.pause(self.rank)
        record = {
            "run_id": self.run_id,
            "rank": self.rank,
            "until": time.time() + seconds,
            "reason": reason,
        }
        try:
            write_json_atomic(path, record)
        except OSError:
            return None
        return path


_beacon: _Beacon | None = None


def _get_beacon() -> _Beacon:
    global _beacon
    if _beacon is None:
        _beacon = _Beacon()
    return _beacon


def heartbeat(step: int | None = None) -> None:
    """Tell the watchdog this rank made progress: ``step`` is the last COMPLETED global step
    (the meaning of "step" everywhere: step lines, reports), or None when only alive.

    Safe to call every step from every rank: a write happens at most when the step changes or
    once a second, and nothing at all happens when no watchdog runs.
    """
    _get_beacon().beat(step)


@contextlib.contextmanager
def expect_pause(seconds: float, reason: str = "") -> Iterator[None]:
    """Announce a long pause (a checkpoint save, an evaluation) so it is not reported as a hang.

    The watchdog suspends stall detection for up to ``seconds`` or until the block ends, then
    counts the end of the block as progress.
    """
    beacon = _get_beacon()
    path = beacon.pause(seconds, reason)
    try:
        yield
    finally:
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()
