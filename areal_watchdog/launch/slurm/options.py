"""``launch.slurm``: the sbatch options a config may set, each checked before anything runs."""

from __future__ import annotations

import re
import shlex
from typing import Any

from areal_watchdog.common.errors import ConfigError
from areal_watchdog.config.model import SLURM_KEYS, JobConfig

_TIME = re.compile(r"(?:(?P<d>\d+)-)?(?P<clock>\d+(?::\d+){0,2})")
TIME_FORMS = "must be minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (Slurm's --time)"


def parse_time_minutes(value: int | str, source: str) -> int:
    """Slurm's ``--time`` as whole minutes, rounded up: ``90``, ``"MM:SS"``, ``"HH:MM:SS"``,
    ``"D-HH"``, ``"D-HH:MM"``, ``"D-HH:MM:SS"`` (``"5:30"`` is five and a half minutes, as
    Slurm reads it)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ConfigError(
                source, "launch.slurm.time", f"must be at least 1 minute, got {value}"
            )
        return value
    match = _TIME.fullmatch(str(value).strip())
    if not match:
        raise ConfigError(source, "launch.slurm.time", f"{TIME_FORMS}, got {value!r}")
    parts = [int(p) for p in match["clock"].split(":")]
    if match["d"] is not None:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = (parts + [0, 0])[:3]
    else:  # MM | MM:SS | HH:MM:SS
        hours, minutes, seconds = (
            ([0] * (3 - len(parts)) + parts)
            if len(parts) == 3
            else (0, parts[0], parts[1] if len(parts) == 2 else 0)
        )
    total = int(match["d"] or 0) * 1440 + hours * 60 + minutes + (1 if seconds else 0)
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
