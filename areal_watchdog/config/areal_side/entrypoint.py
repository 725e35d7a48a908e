"""The training script a config names, and how it is launched (``launch.mode``)."""

from __future__ import annotations

from pathlib import Path

from areal_watchdog.common.errors import ConfigError
from areal_watchdog.config.areal_side.areal import resolve_mode
from areal_watchdog.config.model import JobConfig


def resolve_entrypoint(config: JobConfig) -> str:
    """A script path made absolute: relative to the config file first (the script that sits
    beside the config is the one it was written for), then to the working directory."""
    entry = config.launch.entrypoint
    if not entry.endswith(".py"):
        return entry  # a module name
    for base in (Path(config.source).resolve().parent, Path.cwd()):
        candidate = (base / entry).resolve()
        if candidate.is_file():
            return str(candidate)
    raise ConfigError(
        config.source,
        "launch.entrypoint",
        f"no such file: {entry} (looked beside the config, then in the working directory)",
    )


def launch_mode(config: JobConfig) -> str:
    """``launch.mode`` with ``auto`` decided by the script: single controller for AReaL's."""
    return resolve_mode(config.launch.mode, resolve_entrypoint(config))
