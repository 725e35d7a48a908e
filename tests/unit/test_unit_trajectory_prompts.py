"""The prompt a quarantine names a poisoned group by: the tokens of the group's first sequence
before the first trained one, padding left out, decoded. The tokenizer is stood in for (loading
transformers costs seconds); the dumps are written by the real recorder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from areal_watchdog.trajectory import prompts
from areal_watchdog.trajectory.format import DumpError
from areal_watchdog.trajectory.prompts import group_prompts, prompt_ids
from areal_watchdog.trajectory.recorder import TrajectoryRecorder


def sequence(
    ids: list[int], trained_from: int | None, pad_left: int = 0
) -> dict[str, torch.Tensor]:
    """One group of one sequence: ``pad_left`` zeros, then ``ids``; trained from that index."""
    tokens = torch.tensor([[0] * pad_left + ids])
    keep = torch.tensor([[False] * pad_left + [True] * len(ids)])
    trained = torch.zeros_like(tokens)
    if trained_from is not None:
        trained[0, pad_left + trained_from :] = 1
    return {"input_ids": tokens, "attention_mask": keep, "loss_mask": trained}


def test_the_prompt_is_what_comes_before_the_first_trained_token() -> None:
    assert prompt_ids(sequence([11, 12, 13, 21, 22], trained_from=3)) == [11, 12, 13]


def test_left_padding_is_not_part_of_the_prompt() -> None:
    assert prompt_ids(sequence([11, 12, 21], trained_from=2, pad_left=3)) == [11, 12]


def test_without_a_trained_token_or_a_mask_the_whole_sequence_is_the_prompt() -> None:
    assert prompt_ids(sequence([11, 12], trained_from=None)) == [11, 12]
    assert prompt_ids({"input_ids": torch.tensor([[5, 6, 7]])}) == [5, 6, 7]


def words(ids: list[int]) -> str:
    return " ".join(f"w{i}" for i in ids)


def test_the_chosen_groups_of_a_dumped_step_are_decoded_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = TrajectoryRecorder(tmp_path, beats=False)
    try:
        rec.record(4, [sequence([1, 2, 9], 2), sequence([3, 9], 1), sequence([4, 5, 6, 9], 3)])
    finally:
        rec.close(10)
    asked: list[str] = []

    def decoder(tokenizer: str) -> Callable[[list[int]], str]:
        asked.append(tokenizer)
        return words

    monkeypatch.setattr(prompts, "local_decoder", decoder)
    assert group_prompts(tmp_path, 4, (0, 2), "/models/tok") == ["w1 w2", "w4 w5 w6"]
    assert asked == ["/models/tok"]
    with pytest.raises(DumpError, match="step 4 has 3 groups"):
        group_prompts(tmp_path, 4, (3,), "/models/tok")
