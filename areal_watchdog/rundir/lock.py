"""One launch at a time per run directory: a second launch into a directory in use is refused.

The local launcher holds an exclusive ``flock`` on ``watchdog/launch.lock`` for as long as it
runs (the kernel drops it when the launcher dies, even by ``kill -9``); the file names the
holder so that the refusal can say who.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from areal_watchdog.common.errors import UserError


def hold_run_lock(watch_dir: Path) -> int:
    """Take the run directory's lock for this process; return its descriptor (keep it open)."""
    path = watch_dir / "launch.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 4096).decode(errors="replace").strip() or "{}"
        os.close(fd)
        try:
            who = json.loads(holder)
        except ValueError:
            who = {}
        raise UserError(
            f"{watch_dir.parent}: already in use by areal-launch pid {who.get('pid', '?')} "
            f"(since {who.get('since', '?')}); wait for it to end or choose another trial_name"
        ) from None
    os.ftruncate(fd, 0)
    record = {"pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.write(fd, json.dumps(record).encode())
    return fd
