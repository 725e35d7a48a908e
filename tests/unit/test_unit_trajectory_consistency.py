"""The rollout-consistency figures and flags (``trajectory.rollout_consistency.consistency``), and
where the weights of a version are (``trajectory.rollout_consistency.recompute.weights_of``), on
plain numbers and folders: what the table of ``areal-launch check-consistency`` says."""

from __future__ import annotations

import getpass
import math
import sys
from pathlib import Path

import pytest
import torch

from areal_watchdog.trajectory.rollout_consistency.consistency import (
    SequenceTokens,
    StepConsistency,
    compare_step,
    histogram,
)
from areal_watchdog.trajectory.rollout_consistency.consistency_plot import LABELS, draw
from areal_watchdog.trajectory.rollout_consistency.greedy import dumped_prompts
from areal_watchdog.trajectory.rollout_consistency.recompute import weights_of


def seq(engine: list[float], trainer: list[float], versions: list[int] | None = None,
        group: int = 0) -> SequenceTokens:  # fmt: skip
    n = len(engine)
    return SequenceTokens(group, 0, list(range(n + 3)), list(range(3, n + 3)), engine, trainer,
                          versions or [0] * n)  # fmt: skip


def test_close_log_probs_are_numerics_with_no_flag_and_no_worst_token() -> None:
    result = compare_step(4, [seq([-1.0, -2.0], [-1.0001, -2.0002])])
    assert result.tokens == 2 and result.flags == [] and result.worst == []
    assert math.isclose(result.mean_abs, 0.00015, rel_tol=1e-6)
    assert 0 <= result.kl < 1e-7 and result.over_threshold == 0


def test_other_weights_are_said_with_the_worst_token() -> None:
    result = compare_step(1, [seq([-1.0, -2.0, -0.5], [-1.3, -1.2, -0.4])], threshold=0.5)
    assert result.over_threshold == 1 / 3 and result.max_abs == 0.8
    (worst,) = result.worst
    assert (worst.position, worst.engine, worst.trainer) == (4, -2.0, -1.2)
    (flag,) = result.flags
    assert flag.startswith("a mean gap of 0.400 is more than numerics: the engine's weights")


def test_a_gap_on_the_first_generated_token_is_another_prompt() -> None:
    sequences = [seq([-1.0, -2.0, -3.0], [-3.0, -2.0, -3.0], group=g) for g in range(2)]
    (flag,) = compare_step(0, sequences).flags
    assert flag.startswith("the gap sits on the first generated token (2.000 there, 0.000 later)")
    assert "chat template" in flag


def test_versions_without_weights_and_mixed_versions_are_flagged() -> None:
    result = compare_step(2, [seq([-1.0, -1.0], [-1.0, -1.0], versions=[1, 2])], unchecked=5,
                          truncated=1)  # fmt: skip
    assert [f.split(" ")[0:3] for f in result.flags] == [
        ["5", "trained", "token(s)"], ["the", "step", "mixes"], ["1", "sequence(s)", "reach"],
    ]  # fmt: skip
    assert "version skew" in result.flags[0]


def test_no_compared_token_is_zeros_not_an_error() -> None:
    result = compare_step(0, [], unchecked=3)
    assert (result.tokens, result.mean_abs, result.kl, result.over_threshold) == (0, 0, 0, 0)


def test_gaps_fall_in_decades() -> None:
    assert histogram([0.0, 5e-4, 0.05, 0.3, 3.0], (1e-3, 0.1, 1.0)) == [2, 1, 1, 1]


def test_each_version_has_its_weights(tmp_path: Path) -> None:
    saver = {"fileroot": str(tmp_path), "experiment_name": "e", "trial_name": "t"}
    raw = {"actor": {"path": "/models/base"}, "saver": saver}
    root = tmp_path / "checkpoints" / getpass.getuser() / "e" / "t" / "default"
    saved = root / "epoch0epochstep2globalstep2"
    saved.mkdir(parents=True)
    (saved / "config.json").write_text("{}")
    (root / "epoch0epochstep0globalstep0").mkdir()  # no config.json: an unfinished save
    find = weights_of(raw, None)
    assert find(0) == Path("/models/base")  # the initial weights
    assert find(3) == saved  # made by step 2
    assert find(1) is None and find(2) is None
    assert weights_of(raw, tmp_path)(3) == tmp_path  # --weights: every version
    assert weights_of({}, None)(1) is None


def test_the_recover_checkpoint_holds_the_version_after_its_step(tmp_path: Path) -> None:
    """AReaL keeps one recover checkpoint, the newest: holding global step 4, it has the weights
    of version 5 (after a hang at step 5, those that generated it)."""
    section = {"fileroot": str(tmp_path), "experiment_name": "e", "trial_name": "t", "mode": "auto"}
    raw = {"actor": {"path": "/models/base"}, "recover": section}
    root = tmp_path / "checkpoints" / getpass.getuser() / "e" / "t"
    (root / "recover_info").mkdir(parents=True)
    (root / "recover_info" / "step_info.json").write_text('{"global_step": 4}')
    checkpoint = root / "default" / "recover_checkpoint"
    assert weights_of(raw, None)(5) is None  # no checkpoint written yet
    checkpoint.mkdir(parents=True)
    (checkpoint / ".metadata").write_bytes(b"")
    find = weights_of(raw, None)
    assert find(5) == checkpoint and find(4) is None and find(0) == Path("/models/base")


def test_greedy_compares_distinct_prompts_and_no_more_than_the_step_holds() -> None:
    """A batch of 4 groups that holds 2 prompts (each in two groups): ``--generate 4`` compares
    the 2 distinct prompts, once each (it printed "4 prompts" and compared 2, then repeats)."""

    def group(prompt: list[int]) -> dict[str, torch.Tensor]:
        ids = torch.tensor([[*prompt, 9, 9]], dtype=torch.int32)
        mask = torch.tensor([[0] * len(prompt) + [1, 1]], dtype=torch.int32)
        return {"input_ids": ids, "loss_mask": mask, "logprobs": torch.zeros(ids.shape)}

    batch = [group([1, 2]), group([1, 2]), group([3, 4, 5]), group([3, 4, 5])]
    assert dumped_prompts(batch, 4) == [[1, 2], [3, 4, 5]]
    assert dumped_prompts(batch, 1) == [[1, 2]]


def test_the_plot_has_a_bar_per_bin_and_step_and_says_when_it_cannot_be_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    steps = [StepConsistency(s, 3, 0.1, 0.9, 0.0, 0.0, [1e-5, 0.2, 3.0]) for s in (0, 4)]
    plot = tmp_path / "steps.svg"
    assert draw(steps, 0.5, plot) is None
    text = plot.read_text()
    assert text.count('id="bin-0-') == text.count('id="bin-4-') == len(LABELS) == 8
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert "pip install 'areal-watchdog[plots]'" in (draw(steps, 0.5, tmp_path / "x.svg") or "")
