"""What the watchdog arms inside a watched process, whether our rank wrapper started it
(torchrun ranks) or the ``sitecustomize`` hook did (AReaL's controller, workers and servers).

- ``allow_any_tracer``: ``prctl(PR_SET_PTRACER, ANY)`` so a sidecar that is not our ancestor
  may attach under Yama ``ptrace_scope=1``;
- ``arm_stack_dump``: ``faulthandler`` registered on ``COOPERATIVE_SIGNAL`` (SIGURG, ignored by
  default: a stray one harms nothing) writing every thread's stack to a file: stacks without
  ptrace, answered while the main thread is blocked in a collective;
- ``exit_record``: how the process ended, secrets of its own environment scrubbed before any cut.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

from areal_watchdog.common.atomic import open_append
from areal_watchdog.common.secrets.redact import Redactor
from areal_watchdog.rundir.layout import COOPERATIVE_SIGNAL

_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = -1


def allow_any_tracer() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(
            _PR_SET_PTRACER, ctypes.c_ulong(_PR_SET_PTRACER_ANY & 0xFFFFFFFFFFFFFFFF), 0, 0, 0
        )
    except (OSError, AttributeError):
        pass


def arm_stack_dump(path: Path) -> TextIO | None:
    """Register the cooperative dump to ``path``; the open file (kept open for the process's
    life, as faulthandler writes to its descriptor), or None when it cannot be armed."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        stack_file = open_append(path)
        faulthandler.register(COOPERATIVE_SIGNAL, file=stack_file, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return None
    return stack_file


def scrub(text: str) -> str:
    """The process's own secrets (its environment) out of what it records."""
    return Redactor.from_environment().scrub(text)


def exit_record(kind: str, code: int | None, exc: BaseException | None = None) -> dict[str, Any]:
    """An exit record: ``returned`` | ``exit`` | ``exception``, with the traceback scrubbed
    before it is cut (no half secrets)."""
    record: dict[str, Any] = {"pid": os.getpid(), "time": time.time(), "kind": kind, "code": code}
    if exc is not None:
        record["exc_type"] = type(exc).__name__
        record["message"] = scrub(str(exc))[:2000]
        record["traceback"] = scrub("".join(traceback.format_exception(exc)))[-8000:]
    return record


def exit_code(code: object) -> int:
    """``SystemExit.code`` as the process's exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


def quietly(step: Any, *args: Any) -> None:
    """Run one arming step; the watched process must never notice a failure of ours."""
    with contextlib.suppress(Exception):
        step(*args)
