"""Stage 'trajectory': dump each step's rollout batch inside the ranks, read it back, plan a replay.

Training scripts import the public names from here (``from areal_watchdog.trajectory import
TrajectoryRecorder, Replay``), as they did when this was one module. They are loaded on first
use, so that the launcher and the sidecar, which read only the file layout, never import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "DumpError": "format",
    "TrajectoryRecorder": "recorder",
    "Replay": "reader",
    "load_global_batch": "reader",
    "load_step_file": "reader",
    "split_for_rank": "reader",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
