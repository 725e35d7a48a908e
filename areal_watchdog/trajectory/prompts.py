"""The prompt of a dumped group, as text: what a quarantine names a poisoned row by.

A group's first sequence holds the prompt then the completion; the prompt is the tokens before
the first trained one (``loss_mask``), decoded with the run's own tokenizer, loaded from this
machine only: a launcher never waits on a model hub (``HF_HUB_OFFLINE`` while it loads, and
``local_files_only``). Imports torch and transformers: the launcher loads this only after a
bisection.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from areal_watchdog.trajectory.reader import load_global_batch, select_groups

OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def group_prompts(dump_dir: Path, step: int, groups: tuple[int, ...], tokenizer: str) -> list[str]:
    """The decoded prompt of each of ``groups`` of ``step``, in order."""
    decode = local_decoder(tokenizer)
    batch = select_groups(load_global_batch(dump_dir, step), list(groups), step)
    return [decode(prompt_ids(group)) for group in batch]


def local_decoder(tokenizer: str) -> Callable[[list[int]], str]:
    """The tokenizer's ``decode``, from a directory or this machine's cache, never a hub."""
    with _offline():
        from transformers import AutoTokenizer

        loaded = AutoTokenizer.from_pretrained(
            tokenizer, trust_remote_code=True, local_files_only=True
        )
    return loaded.decode


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """The hub's offline switches, for this process only while it loads (the jobs this
    launcher starts later keep the environment they were given)."""
    saved = {name: os.environ.get(name) for name in OFFLINE}
    os.environ.update(dict.fromkeys(OFFLINE, "1"))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def prompt_ids(group: dict[str, Any]) -> list[int]:
    """The prompt tokens of a group's first sequence (padding left out)."""
    ids = group["input_ids"][0]
    keep = group["attention_mask"][0].bool() if "attention_mask" in group else None
    trained = group["loss_mask"][0] if "loss_mask" in group else None
    if keep is not None:
        ids, trained = ids[keep], trained[keep] if trained is not None else None
    end = len(ids)
    if trained is not None and bool(trained.any()):
        end = int(trained.nonzero()[0])
    return [int(t) for t in ids[:end]]
