"""Wake a listener thread in another process by writing one line to its FIFO."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def write_fifo(path: Path, message: str) -> bool:
    """Write ``message`` to the FIFO at ``path`` only if someone listens; never block.

    A path that is not a FIFO (a planted regular file or symlink) is refused."""
    try:
        if not stat.S_ISFIFO(os.lstat(path).st_mode):
            return False
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)  # ENXIO: nobody listens
    except OSError:
        return False
    try:
        os.write(fd, f"{message}\n".encode())
    except OSError:
        return False
    finally:
        os.close(fd)
    return True
