"""Leave quarantined rows out of a resumed AReaL run's training data, with no edit of the script.

``on_hang: resume`` names the rows a bisection found to hang in ``quarantine.json``
(``trajectory.quarantine``) and points the resumed run at it. Every trainer AReaL builds gets
its ``train_dataset`` through ``PPOTrainer.__init__``, whatever loaded it: the dataset is
filtered there (``datasets.Dataset.filter``, or a plain list), before AReaL makes its data
loader. What was left out is said in one line; a dataset that cannot be filtered is said too,
and then the same hang comes back and the launcher stops (never a silent skip, never a loop).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from areal_watchdog.rank.areal_hooks.after_import import after_import
from areal_watchdog.rank.areal_hooks.areal_trajectory import TRAINER_MODULE
from areal_watchdog.trajectory.quarantine import (
    ENV_QUARANTINE,
    is_quarantined,
    read_rows,
    refusal,
    say_left_out,
    too_many,
)


def install() -> None:
    """Filter the training data of every trainer this process builds, when the run says so."""
    path = os.environ.get(ENV_QUARANTINE)
    if path:
        after_import(TRAINER_MODULE, lambda module: _patch(module, Path(path)))


def _say(message: str) -> None:
    print(f"[areal-watchdog] quarantine: {message}", file=sys.stderr, flush=True)


def _patch(module: ModuleType, path: Path) -> None:
    prompts = [row.prompt for row in read_rows(path)]
    if not prompts:
        return
    trainer = module.PPOTrainer
    init = trainer.__init__
    signature = inspect.signature(init)

    @functools.wraps(init)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        dataset = bound.arguments.get("train_dataset")
        if dataset is not None:
            bound.arguments["train_dataset"] = without_rows(dataset, prompts, path)
        init(*bound.args, **bound.kwargs)

    trainer.__init__ = wrapped


def without_rows(dataset: Any, prompts: list[str], path: Path) -> Any:
    """``dataset`` less its quarantined rows (the same object when none matched, or when the
    match is refused: more rows than the quarantine can mean)."""
    keep = functools.partial(_keep, prompts=prompts)
    if hasattr(dataset, "filter") and hasattr(dataset, "num_rows"):  # datasets.Dataset
        kept = dataset.filter(keep, keep_in_memory=True)
        before, after = dataset.num_rows, kept.num_rows
    elif isinstance(dataset, list):
        kept = [row for row in dataset if keep(row)]
        before, after = len(dataset), len(kept)
    else:
        _say(
            f"cannot leave rows out of a {type(dataset).__name__} (a datasets.Dataset or a "
            f"list can be): training on all of it, {len(prompts)} quarantined row(s) included"
        )
        return dataset
    if before == after:
        said = f"none of the {len(prompts)} quarantined prompt(s) of {path} matched a row"
        say_left_out(path, 0, before, said)
        return dataset
    if too_many(before - after, len(prompts)):
        say_left_out(path, 0, before, refusal(before - after, before, len(prompts), path))
        return dataset
    say_left_out(path, before - after, before, f"{before - after} row(s) of the training data "
                 f"left out, as {path} lists")  # fmt: skip
    return kept


def _keep(row: Any, prompts: list[str]) -> bool:
    return not is_quarantined(row, prompts)
