"""What an AReaL experiment's replay changes in its config: every section's trial name, the
number of steps, and the weights it starts from.

AReaL repeats ``trial_name`` in each section (actor, rollout, saver, recover, ...) and the run's
resolved config holds the original's: each is moved to the replay's trial, or the replay would
write into the original run. The weights: a replay of step N must start from the weights the run
had after step N-1. AReaL keeps one recover checkpoint per trial, the newest
(``<fileroot>/checkpoints/<user>/<experiment>/<trial>/recover_info``); when it holds step N-1,
the replay loads it through AReaL's own recover path (``recover.mode=auto`` pointed at the
original trial; our hook keeps the replay from writing a checkpoint back). Otherwise it starts
from ``actor.path`` and says so.
"""

from __future__ import annotations

import getpass
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import read_json
from areal_watchdog.common.errors import UserError
from areal_watchdog.config.model import JobConfig

_DP = re.compile(r"d\d+")  # the data-parallel size in an AReaL allocation ("fsdp:d2p1t1")


@dataclass(frozen=True)
class ArealReplay:
    """The overrides of an AReaL replay, for people where its weights come from, and the
    re-sharding (kept apart: it changes the config on purpose, the config hash check skips it)."""

    overrides: list[str]
    weights: str
    resharding: list[str] = field(default_factory=list)


def checkpoint_root(section: object) -> Path | None:
    """Where AReaL saves what a config section (``saver``, ``recover``) names:
    ``<fileroot>/checkpoints/<user>/<experiment>/<trial>`` (``areal/utils/saver.py``)."""
    if not isinstance(section, dict):
        return None
    names = [section.get(k) for k in ("fileroot", "experiment_name", "trial_name")]
    if not all(isinstance(n, str) and n for n in names):
        return None
    fileroot, experiment, trial = names
    return Path(fileroot, "checkpoints", getpass.getuser(), experiment, trial)


def recover_info_dir(raw: dict[str, Any]) -> Path | None:
    """Where AReaL keeps the run's recover info, or None when the run did not save any."""
    section = raw.get("recover")
    if not isinstance(section, dict) or section.get("mode") in (None, "disabled", "off"):
        return None
    root = checkpoint_root(section)
    return root / "recover_info" if root else None


def recovered_step(info_dir: Path) -> int | None:
    """The global step whose weights the recover checkpoint holds."""
    record = read_json(info_dir / "step_info.json")
    step = record.get("global_step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and step >= 0 else None


def trial_overrides(raw: dict[str, Any], old: str, new: str, prefix: str = "") -> list[str]:
    """``++<section>.trial_name=<new>`` for every nested section that names the old trial."""
    found = []
    for key, value in raw.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            found += trial_overrides(value, old, new, f"{path}.")
        elif prefix and key == "trial_name" and value == old:
            found.append(f"++{path}={new}")
    return found


def resharding(original: JobConfig, nproc: int | None) -> list[str]:
    """The ``actor.backend`` override that trains on ``nproc`` data-parallel ranks."""
    if nproc is None:
        return []
    actor = original.raw.get("actor")
    backend = actor.get("backend") if isinstance(actor, dict) else None
    head, colon, dims = backend.rpartition(":") if isinstance(backend, str) else ("", "", "")
    if not colon or len(_DP.findall(dims)) != 1:
        raise UserError(
            f"--nproc {nproc}: actor.backend {backend!r} has no single d<N> to change; "
            "pass actor.backend=... with --allow-config-change instead"
        )
    return [f"actor.backend={head}:{_DP.sub(f'd{nproc}', dims)}"]


def areal_replay(
    original: JobConfig, trial: str, steps: list[int], nproc: int | None = None
) -> ArealReplay:
    """The overrides that replay ``steps`` of an AReaL run as ``trial`` on ``nproc`` ranks."""
    plan = _weights(original, trial, steps)
    return ArealReplay(plan.overrides, plan.weights, resharding(original, nproc))


def _weights(original: JobConfig, trial: str, steps: list[int]) -> ArealReplay:
    overrides = trial_overrides(original.raw, original.trial_name, trial)
    first = steps[0]
    if first == 0:
        weights = "the config's initial weights (actor.path), as the run had at step 0"
        return ArealReplay([*overrides, f"++total_train_steps={len(steps)}"], weights)
    info_dir = recover_info_dir(original.raw)
    saved = recovered_step(info_dir) if info_dir else None
    if saved == first - 1:
        overrides = [o for o in overrides if not o.startswith("++recover.trial_name=")]
        overrides += [
            "++recover.mode=auto",
            f"++recover.trial_name={original.trial_name}",
            f"++total_train_steps={first + len(steps)}",
        ]
        return ArealReplay(overrides, f"AReaL's recover checkpoint of step {saved} ({info_dir})")
    if info_dir is None:
        section = original.raw.get("recover")
        mode = section.get("mode") if isinstance(section, dict) else None
        why = f"the run saved no recover checkpoint (recover.mode: {mode})"
    elif saved is None:
        why = f"no recover checkpoint in {info_dir}"
    else:
        why = f"the recover checkpoint holds step {saved}, not {first - 1} (AReaL keeps the newest)"
        if saved < first - 1:
            why += f"; replay --from {saved + 1} to reach step {first} with the run's weights"
    weights = f"the config's initial weights (actor.path): {why}"
    return ArealReplay([*overrides, f"++total_train_steps={len(steps)}"], weights)
