"""The one rule for records in a run directory: a record counts only for the run that wrote it.

A run directory is reused across launches (and a stale file may survive a crash), so every
record the launcher, the ranks and the sidecars exchange carries the run id and is ignored when
it does not match.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import read_json


def read_run_record(path: Path, run_id: str) -> dict[str, Any] | None:
    """The JSON record at ``path`` if it belongs to run ``run_id``, else None."""
    record = read_json(path)
    if isinstance(record, dict) and record.get("run_id") == run_id:
        return record
    return None
