"""The prompt of a dumped group, as text: what a quarantine names a poisoned row by.

A group's first sequence holds the prompt then the completion; the prompt is the tokens before
the first trained one (``loss_mask``), decoded with the run's own tokenizer. Imports torch and
transformers: the launcher loads this only after a bisection.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from areal_watchdog.trajectory.reader import load_global_batch, select_groups


def group_prompts(dump_dir: Path, step: int, groups: tuple[int, ...], tokenizer: str) -> list[str]:
    """The decoded prompt of each of ``groups`` of ``step``, in order."""
    from transformers import AutoTokenizer

    decode = AutoTokenizer.from_pretrained(tokenizer, trust_remote_code=True).decode
    batch = select_groups(load_global_batch(dump_dir, step), list(groups), step)
    return [decode(prompt_ids(group)) for group in batch]


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
