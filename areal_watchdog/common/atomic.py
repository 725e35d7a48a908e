"""Small files that are never seen half-written: write to a temporary name, then rename."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: Any, fsync: bool = False) -> None:
    """Write ``data`` as JSON to ``path`` so readers see the old or the new file, never a mix."""
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True, default=str), fsync)


def write_text_atomic(path: Path, text: str, fsync: bool = False) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> Any | None:
    """The JSON in ``path``, or None when it is missing, unreadable or half-written."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None
