"""Wake a listener thread in another process by writing one line to its FIFO."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import TypeVar

from areal_watchdog.common.interprocess.backoff import looks

RELISTEN_GRACE = 1.0  # seconds a listener gets to be back in its open() of the FIFO

K = TypeVar("K")


def write_fifo(path: Path, message: str) -> bool:
    """Write ``message`` to the FIFO at ``path`` only if someone listens; never block.

    A path that is not a FIFO (a planted regular file or symlink) is refused: a symlink by
    the open, anything else by what the open file is (one lookup on the shared filesystem,
    not two)."""
    return _write(path, message) is True


def write_fifos(paths: dict[K, Path], message: str, grace: float = RELISTEN_GRACE) -> set[K]:
    """The keys whose FIFO took ``message``. A FIFO that exists but has no reader at this
    instant is tried again for ``grace`` seconds: its listener is between two requests, or was
    just resumed from a py-spy dump that interrupted its ``open()`` (a ptrace stop drops the
    reader until the call restarts; CI lost a rank's Flight Recorder trace to that once)."""
    sent: set[K] = set()
    unheard: dict[K, Path] = {}
    for key, path in paths.items():
        answer = _write(path, message)
        if answer:
            sent.add(key)
        elif answer is None:
            unheard[key] = path
    for _ in looks(grace if unheard else 0):
        for key, path in list(unheard.items()):
            answer = _write(path, message)
            if answer is not None:
                del unheard[key]
            if answer:
                sent.add(key)
        if not unheard:
            break
    return sent


def _write(path: Path, message: str) -> bool | None:
    """True when written, None when the FIFO is there but nobody listens now, else False."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        return None if exc.errno == errno.ENXIO else False
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        os.write(fd, f"{message}\n".encode())
    except OSError:
        return False
    finally:
        os.close(fd)
    return True
