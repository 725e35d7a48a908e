"""Rank-side progress API: cheap heartbeats and announced pauses, no-ops without a watchdog."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from areal_watchdog.common.atomic import write_json_atomic
from areal_watchdog.rundir.layout import ENV_RUN_ID, ENV_WATCH_DIR, RunLayout
from areal_watchdog.rundir.progress.beats import beat_name, beats_node, pause_name


class _Beacon:
    """Where this process writes its heartbeats (``rundir.progress.beats``); resolved once from the
    environment."""

    def __init__(self) -> None:
        watch_dir = os.environ.get(ENV_WATCH_DIR)
        self.rank = int(os.environ.get("RANK", "0"))
        self.run_id = os.environ.get(ENV_RUN_ID, "")
        layout = RunLayout(Path(watch_dir).parent) if watch_dir else None
        self.directory = layout.heartbeats(beats_node()) if layout else None
        self.current: Path | None = None  # this rank's heartbeat name, once written
        self.last_step: int | None = None

    def beat(self, step: int | None) -> None:
        if self.directory is None or (self.current is not None and step in (None, self.last_step)):
            return  # nothing new: alive without a step says nothing a listing would show
        beat = self.directory / beat_name(self.rank, step, self.run_id)
        try:
            if self.current is not None:
                os.rename(self.current, beat)
            else:
                self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.close(os.open(beat, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW, 0o600))
        except OSError:
            self.current = None  # written anew next time (the run directory was reset)
            return  # the watchdog observes; it never breaks training
        self.current, self.last_step = beat, step

    def pause(self, seconds: float, reason: str) -> Path | None:
        if self.directory is None:
            return None
        path = self.directory / pause_name(self.rank)
        record = {
            "run_id": self.run_id,
            "rank": self.rank,
            "until": time.time() + seconds,
            "reason": reason,
        }
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
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

    Safe to call every step from every rank: a file is renamed only when the step changes (the
    first call creates it), and nothing at all happens when no watchdog runs.
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
