"""Things found by name: ours in a table of ``"module:attribute"`` strings, another package's
in an entry-point group (backends, sinks). Importing only what is asked for keeps a command
from loading every backend and sink."""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Mapping
from typing import Any


def registered(ours: Mapping[str, str], group: str) -> list[str]:
    """Every name: ours first, then the installed packages'."""
    found = importlib.metadata.entry_points(group=group)
    return [*ours, *sorted(e.name for e in found if e.name not in ours)]


def load(name: str, ours: Mapping[str, str], group: str) -> Any | None:
    """What ``name`` is registered as; None when nobody registers it."""
    target = ours.get(name)
    if target is None:
        found = [e for e in importlib.metadata.entry_points(group=group) if e.name == name]
        return found[0].load() if found else None
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)
