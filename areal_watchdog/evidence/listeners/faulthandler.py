"""Stacks without ptrace: ask the rank's own ``faulthandler`` (armed by ``rank.main``).

The rank registered ``faulthandler`` on a signal that is ignored by default; on that signal it
appends every thread's stack to its per-rank file, from the signal handler itself, so it answers
while the main thread is blocked inside a collective. Only ranks whose registration advertises
the signal are ever sent it.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from areal_watchdog.common.interprocess.backoff import looks
from areal_watchdog.evidence.model import Frame, ThreadStack
from areal_watchdog.evidence.pyspy import StackError

_THREAD_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME_LINE = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>.*)$')
_SETTLE = 0.05  # the file must stop growing for this long before it is read


def dump_cooperative(
    pid: int, signal_number: int, stack_file: Path, timeout: float
) -> list[ThreadStack]:
    """Signal the rank and read the stacks it appends to ``stack_file``."""
    try:
        start = stack_file.stat().st_size
    except OSError:
        raise StackError(f"no cooperative stack file at {stack_file}") from None
    try:
        os.kill(pid, signal_number)
    except OSError as exc:
        raise StackError(f"cannot signal pid {pid}: {exc.strerror}") from None
    size, stable_since = start, None
    for _ in looks(timeout):
        current = stack_file.stat().st_size
        if current != size:
            size, stable_since = current, time.monotonic()
        elif size > start and stable_since and time.monotonic() - stable_since >= _SETTLE:
            break
    if size <= start:
        raise StackError(f"the rank wrote no stack within {timeout:g} s")
    with open(stack_file, encoding="utf-8", errors="replace") as fh:
        fh.seek(start)
        return parse_faulthandler(fh.read(size - start))


def parse_faulthandler(text: str) -> list[ThreadStack]:
    """Parse faulthandler's dump (``Thread 0x...`` blocks, innermost frame first)."""
    threads: list[ThreadStack] = []
    current: ThreadStack | None = None
    for line in text.splitlines():
        header = _THREAD_HEADER.match(line)
        if header:
            current = ThreadStack(None, [])
            threads.append(current)
            continue
        frame = _FRAME_LINE.match(line)
        if frame and current is not None:
            current.frames.append(Frame(frame["name"], frame["file"], int(frame["line"])))
    # faulthandler lists the newest thread first: the main thread is the last block.
    if threads:
        threads[-1].name = "MainThread"
    return threads
