"""Small files that are never seen half-written, and never written through a planted symlink.

A temporary file is created next to the target with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (mode
0600 whatever the umask, so nothing is readable before it is complete), written, then renamed
over the target: ``rename`` replaces a symlink itself, never the file it points to. The rename is
atomic on local filesystems and NFS alike.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

PRIVATE = 0o600


def write_json_atomic(
    path: Path, data: Any, fsync: bool = False, mode: int = PRIVATE, compact: bool = False
) -> None:
    """Write ``data`` as JSON to ``path`` so readers see the old or the new file, never a mix.
    ``compact``: one line, keys as they come (evidence of thousands of ranks: a few times
    faster to write than the indented, sorted form people read)."""
    write_text_atomic(path, json_text(data, compact), fsync, mode)


def json_text(data: Any, compact: bool = False) -> str:
    """``data`` as ``write_json_atomic`` writes it."""
    if compact:
        return json.dumps(data, separators=(",", ":"), default=str)
    return json.dumps(data, indent=1, sort_keys=True, default=str)


def write_text_atomic(
    path: Path, text: str | bytes, fsync: bool = False, mode: int = PRIVATE
) -> None:
    """Write ``text`` (or bytes: a picture) to ``path`` through a private temporary file in
    the same directory; a link planted at ``path`` is replaced, never followed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE)
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
            os.fchmod(fh.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_text_in_place(path: Path, text: str, mode: int = PRIVATE) -> None:
    """Write ``text`` to ``path`` directly (a symlink planted at its name is refused): for a
    file nobody reads before a later one says it is complete, or whose reader takes a half
    written one for not there yet. On NFS it saves the temporary file's rename (and its mode's
    change): two round trips of four."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, PRIVATE)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        if mode != PRIVATE:
            os.fchmod(fh.fileno(), mode)


def open_append(path: Path, mode: int = PRIVATE) -> Any:
    """A text file opened for appending that is never a planted symlink; created ``mode``."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, mode)
    os.fchmod(fd, mode)  # an existing file too, through the descriptor: no symlink to follow
    return os.fdopen(fd, "a", encoding="utf-8")


def read_json(path: Path) -> Any | None:
    """The JSON in ``path``, or None when it is missing, unreadable, half-written or a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError, RecursionError):  # a file of 100k nested brackets too
        return None


def mtime(path: Path) -> float:
    """When ``path`` was last written; 0 for a file gone since it was listed."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
