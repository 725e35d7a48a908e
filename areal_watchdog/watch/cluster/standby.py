"""Standby sidecars: every task of AReaL's Slurm jobs starts one; one per node watches, the
others wait for its lock and take over when its task ends."""

from __future__ import annotations

import fcntl
import os
import sys

from areal_watchdog.common.interprocess.parent import die_with_parent
from areal_watchdog.rundir.layout import RunLayout


def wait_for_node_lock(layout: RunLayout, node: str) -> bool:
    """Standby: end with the task that started us (``PR_SET_PDEATHSIG``), and block until this
    node's sidecar lock is ours (the lock is released when its holder's process ends). False
    if the lock cannot be had at all (then another sidecar watches, or nobody can)."""
    die_with_parent()
    try:
        locks = layout.watch_dir / "sidecars"
        locks.mkdir(parents=True, exist_ok=True)
        fd = os.open(locks / f"{node}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until this process ends
    except OSError as exc:
        print(f"[areal-watchdog {node}] no sidecar lock: {exc}", file=sys.stderr)
        return False
    _held.append(fd)
    return True


_held: list[int] = []
