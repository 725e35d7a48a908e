"""``launch.slurm``: the sbatch options a config may set, each checked before anything runs."""

from __future__ import annotations

import re
import shlex
from typing import Any

from areal_watchdog.common.errors import ConfigError
from areal_watchdog.config.model import SLURM_KEYS, JobConfig

_TIME = re.compile(r"^(?:(?P<d>\d+)-)?(?:(?P<h>\d+):)?(?P<m>\d+)(?::(?P<s>\d+))?$")


def parse_time_minutes(value: int | str, source: str) -> int:
    """``90``, ``"90"``, ``"1:30:00"`` or ``"1-00:00:00"`` -> minutes."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ConfigError(
                source, "launch.slurm.time", f"must be at least 1 minute, got {value}"
            )
        return value
    match = _TIME.match(str(value).strip())
    if not match:
        raise ConfigError(
            source, "launch.slurm.time", f"must be minutes or [D-]HH:MM[:SS], got {value!r}"
        )
    days, hours = int(match["d"] or 0), int(match["h"] or 0)
    minutes, seconds = int(match["m"]), int(match["s"] or 0)
    if match["h"] is None and match["s"] is not None:  # "MM:SS"
        hours, minutes, seconds = 0, minutes, seconds
    total = days * 1440 + hours * 60 + minutes + (1 if seconds else 0)
    if total < 1:
        raise ConfigError(source, "launch.slurm.time", f"must be at least 1 minute, got {value!r}")
    return total


def validate_slurm(config: JobConfig) -> dict[str, Any]:
    """``launch.slurm`` checked key by key; a ConfigError names the key before anything runs."""
    section = dict(config.launch.slurm)
    for key, value in section.items():  # unknown keys were refused with the config
        expected = SLURM_KEYS[key]
        if value is not None and (
            not isinstance(value, expected) or (expected is int and isinstance(value, bool))
        ):
            names = (
                expected.__name__
                if isinstance(expected, type)
                else " or ".join(t.__name__ for t in expected)
            )
            raise ConfigError(
                config.source, f"launch.slurm.{key}", f"must be a {names}, got {value!r}"
            )
    if section.get("cpus_per_task") is not None and section["cpus_per_task"] < 1:
        raise ConfigError(config.source, "launch.slurm.cpus_per_task", "must be at least 1")
    if section.get("mem") is not None and not re.fullmatch(r"\d+[KMGT]?B?", str(section["mem"])):
        raise ConfigError(
            config.source,
            "launch.slurm.mem",
            f"must look like 64G or 4000M, got {section['mem']!r}",
        )
    section["time"] = parse_time_minutes(section.get("time", 60), config.source)
    return section


def container_prefix(slurm: dict[str, Any]) -> list[str]:
    prefix = slurm.get("container_prefix") or []
    return shlex.split(prefix) if isinstance(prefix, str) else [str(p) for p in prefix]
