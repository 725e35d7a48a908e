"""Run code right after one of AReaL's modules is imported, before the script can use it: how
our rank-side hooks reach AReaL's classes with no edit of the script (``areal_trajectory``,
``areal_quarantine``)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]
_waiting: dict[str, list[Callback]] = {}


def after_import(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once ``name`` has executed (at once when it already has)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    if name not in _waiting:
        sys.meta_path.insert(0, _AfterImport(name))
    _waiting.setdefault(name, []).append(callback)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Wraps one module's loader to run the waiting callbacks; steps aside for every other
    import."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            for callback in _waiting.pop(fullname, []):
                callback(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
