"""Answer the sidecar's requests for this process's pending asyncio tasks, from a daemon thread.

The thread blocks on a per-process FIFO (``watchdog/tasks/trigger_<pid>``, mode 0600) without
holding the GIL; a write wakes it and it writes ``rank.asyncio_tasks.tasks.snapshot`` to
``watchdog/tasks/tasks_<pid>.json`` within ``TIME_LIMIT`` seconds of work. Between requests it
samples the tasks every ``SAMPLE_INTERVAL`` seconds (only while there are tasks), so that a dump
can say how long each task has been waiting. Any failure disables the listener quietly: the
training process must never notice it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import threading
import time
from pathlib import Path

from areal_watchdog.common.atomic import write_text_atomic
from areal_watchdog.rank.asyncio_tasks.tasks import TaskClock, all_tasks, snapshot
from areal_watchdog.rundir.layout import RunLayout

SAMPLE_INTERVAL = 5.0  # seconds between background samples while tasks exist
MAX_TASKS = 500


def start(layout: RunLayout) -> bool:
    """Create this process's trigger FIFO and start the listener thread; False if impossible."""
    path = layout.tasks_trigger(os.getpid())
    try:
        layout.tasks_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        os.mkfifo(path, 0o600)
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)  # RDWR: never sees EOF, never blocks
    except OSError:
        return False
    thread = threading.Thread(
        target=_listen, args=(layout, fd), name="areal-watchdog-tasks", daemon=True
    )
    thread.start()
    return True


def _listen(layout: RunLayout, fd: int) -> None:
    clock = TaskClock()
    target = layout.tasks_dump(os.getpid())
    while True:
        try:
            ready, _, _ = select.select([fd], [], [], SAMPLE_INTERVAL)
            request = os.read(fd, 4096).decode(errors="replace").split() if ready else []
        except OSError:
            return
        if request:
            _answer(target, clock, request[-1])
        elif all_tasks():
            snapshot(clock, MAX_TASKS)  # only to learn when each task started waiting


def _answer(target: Path, clock: TaskClock, request: str) -> None:
    started = time.perf_counter()
    try:
        record = {"request": request, "pid": os.getpid(), **snapshot(clock, MAX_TASKS)}
    except Exception as exc:  # noqa: BLE001 - report why, never disturb the process
        record = {"request": request, "pid": os.getpid(), "error": f"{type(exc).__name__}: {exc}"}
    record["took_s"] = round(time.perf_counter() - started, 4)
    with contextlib.suppress(OSError):
        write_text_atomic(target, json.dumps(record))
