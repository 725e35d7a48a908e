"""Stacks through ``py-spy dump --json``, with a hard timeout, leaving the target as it was.

A blocking dump pauses the target; if py-spy dies mid-dump the target may stay stopped, so after
every dump a target that is stopped now but was not before gets SIGCONT. A target that was
already stopped before (by its owner) is left stopped: the watchdog observes, it does not steer.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from areal_watchdog.evidence.model import Frame, ThreadStack


class StackError(Exception):
    """No stack could be taken; ``permission`` tells whether ptrace was refused, ``late``
    whether py-spy ran out of time."""

    def __init__(self, message: str, permission: bool = False, late: bool = False) -> None:
        super().__init__(message)
        self.permission = permission
        self.late = late


@functools.lru_cache(maxsize=1)
def pyspy_executable() -> str | None:
    """py-spy next to this interpreter (the venv's), else where its package put it (a venv
    that borrows another's packages, like one for a second AReaL release), else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    if beside.exists():
        return str(beside)
    with contextlib.suppress(importlib.metadata.PackageNotFoundError, TypeError):
        files = importlib.metadata.distribution("py-spy").files or []
        for entry in files:
            if str(entry).endswith("bin/py-spy"):
                installed = Path(entry.locate()).resolve()
                if installed.exists():
                    return str(installed)
    return shutil.which("py-spy")


def dump_pyspy(pid: int, timeout: float, nonblocking: bool = False) -> list[ThreadStack]:
    """The Python stacks of every thread of ``pid``; raises StackError when refused or late.
    ``nonblocking`` reads without suspending the target (no attach to each of its threads)."""
    exe = pyspy_executable()
    if exe is None:
        raise StackError("py-spy is not installed", permission=True)
    was_stopped = _is_stopped(pid)
    env = {**os.environ, "RUST_BACKTRACE": "0"}
    # A blocking dump cannot suspend a process that is already stopped; reading it without
    # suspending is consistent anyway, since it cannot run.
    extra = ["--nonblocking"] if was_stopped or nonblocking else []
    try:
        out = subprocess.run(
            [exe, "dump", "--pid", str(pid), "--json", *extra],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise StackError(f"py-spy did not answer within {timeout:g} s", late=True) from None
    finally:
        if not was_stopped and _is_stopped(pid):
            os.kill(pid, signal.SIGCONT)
    if out.returncode != 0:
        message = (out.stderr.strip().splitlines() or ["py-spy failed"])[0]
        detail = out.stderr.lower()
        permission = "permission denied" in detail or "operation not permitted" in detail
        raise StackError(f"py-spy: {message}", permission=permission)
    try:
        return parse_pyspy_json(out.stdout)
    except (ValueError, KeyError, TypeError) as exc:
        raise StackError(f"py-spy printed unreadable JSON: {exc}") from None


def parse_pyspy_json(text: str) -> list[ThreadStack]:
    """Turn ``py-spy dump --json`` output into ThreadStacks, every thread with its flags."""
    threads = []
    for thread in json.loads(text):
        frames = [
            Frame(str(f.get("name", "?")), str(f.get("filename", "?")), int(f.get("line") or 0))
            for f in thread.get("frames", [])
        ]
        threads.append(
            ThreadStack(
                thread.get("thread_name"),
                frames,
                _flag(thread.get("active")),
                _flag(thread.get("owns_gil")),
                thread.get("thread_id") if isinstance(thread.get("thread_id"), int) else None,
            )
        )
    return threads


def _flag(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _is_stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False
