"""Collect the pending asyncio tasks of this node's watched processes
(``rank.asyncio_tasks.task_listener``).

Only processes the caller already verified as the job's own are asked: the pid names the
trigger FIFO, and a dump counts only if it answers this request and comes from that pid.
"""

from __future__ import annotations

import os
import time
from typing import Any

from areal_watchdog.common.atomic import read_json
from areal_watchdog.common.interprocess.backoff import looks
from areal_watchdog.common.interprocess.fifo import write_fifos
from areal_watchdog.rundir.layout import RunLayout


def collect(layout: RunLayout, pids: list[int], timeout: float) -> dict[int, dict[str, Any]]:
    """Ask each listed process for its tasks; return the dumps that arrive within ``timeout``."""
    request = f"{os.getpid()}-{time.time_ns()}"
    asked = write_fifos({pid: layout.tasks_trigger(pid) for pid in pids}, request)
    dumps: dict[int, dict[str, Any]] = {}
    for _ in looks(timeout if asked else 0):
        if len(dumps) == len(asked):
            break
        for pid in asked:
            record = pid not in dumps and read_json(layout.tasks_dump(pid))
            if isinstance(record, dict) and (record.get("request"), record.get("pid")) == (
                request,
                pid,
            ):
                dumps[pid] = record
    return dumps
