"""Wake a listener thread in another process by writing one line to its FIFO."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def write_fifo(path: Path, message: str) -> bool:
    """Write ``message`` to the FIFO at ``path`` only if someone listens; never block.

    A path that is not a FIFO (a planted regular file or symlink) is refused: a symlink by
    the open, anything else by what the open file is (one lookup on the shared filesystem,
    not two)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)  # ENXIO: nobody listens
    except OSError:
        return False
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        os.write(fd, f"{message}\n".encode())
    except OSError:
        return False
    finally:
        os.close(fd)
    return True
