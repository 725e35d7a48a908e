"""What an AReaL replay changes in the run's config: every section that repeats the trial's name
moves to the replay's trial (or the replay writes into the original run), the data-parallel size
is re-sharded, and the weights come from AReaL's recover checkpoint only when it holds the step
before the first one replayed."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

import pytest

from areal_watchdog.common.errors import UserError
from areal_watchdog.config.load import load_config
from areal_watchdog.config.model import JobConfig
from areal_watchdog.trajectory.replay.areal_replay import (
    areal_replay,
    recover_info_dir,
    recovered_step,
    resharding,
    trial_overrides,
)

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "areal" / "gsm8k_grpo.yaml"


def test_every_nested_trial_name_of_the_old_trial_moves_to_the_new_one() -> None:
    raw = {
        "trial_name": "t",  # the top level is the launcher's own: changed elsewhere
        "actor": {"trial_name": "t", "path": "/m"},
        "saver": {"inner": {"trial_name": "t"}},
        "ref": {"trial_name": "another"},
    }
    assert trial_overrides(raw, "t", "t_replay3") == [
        "++actor.trial_name=t_replay3",
        "++saver.inner.trial_name=t_replay3",
    ]


def test_the_recover_info_is_found_only_where_the_run_saved_it(tmp_path: Path) -> None:
    section = {"fileroot": str(tmp_path), "experiment_name": "e", "trial_name": "t"}
    assert recover_info_dir({"recover": {**section, "mode": "disabled"}}) is None
    assert recover_info_dir({"recover": {**section, "mode": "auto", "trial_name": ""}}) is None
    assert recover_info_dir({}) is None
    info = recover_info_dir({"recover": {**section, "mode": "auto"}})
    assert info == tmp_path / "checkpoints" / getpass.getuser() / "e" / "t" / "recover_info"


@pytest.mark.parametrize(
    ("record", "step"),
    [
        ({"global_step": 4}, 4),
        ({"global_step": -1}, None),
        ({"global_step": "4"}, None),
        ([4], None),
    ],
)
def test_the_recovered_step_is_a_non_negative_int_or_unknown(
    tmp_path: Path, record: object, step: int | None
) -> None:
    (tmp_path / "step_info.json").write_text(json.dumps(record))
    assert recovered_step(tmp_path) == step
    assert recovered_step(tmp_path / "absent") is None


def config(root: Path, backend: str = "fsdp:d4p1t1", recover: str = "auto") -> JobConfig:
    loaded = load_config(
        CONFIG, [f"cluster.fileroot={root}", "trial_name=t", f"recover.mode={recover}"]
    )
    loaded.raw["actor"]["backend"] = backend
    return loaded


def test_resharding_changes_only_the_data_parallel_size(tmp_path: Path) -> None:
    assert resharding(config(tmp_path, "fsdp:d4p1t1"), 2) == ["actor.backend=fsdp:d2p1t1"]
    assert resharding(config(tmp_path, "megatron:d2p2t2"), 1) == ["actor.backend=megatron:d1p2t2"]
    assert resharding(config(tmp_path), None) == []
    with pytest.raises(UserError, match="has no single d<N> to change"):
        resharding(config(tmp_path, "fsdp"), 2)


def test_several_steps_after_the_checkpoint_resume_from_it_and_run_them_all(
    tmp_path: Path,
) -> None:
    original = config(tmp_path)
    info = recover_info_dir(original.raw)
    assert info is not None
    info.mkdir(parents=True)
    (info / "step_info.json").write_text(json.dumps({"global_step": 2}))
    replay = areal_replay(original, "t_replay3", [3, 4], nproc=2)
    assert replay.weights.startswith("AReaL's recover checkpoint of step 2")
    assert "++recover.mode=auto" in replay.overrides
    assert "++recover.trial_name=t" in replay.overrides  # reads the original's checkpoint
    assert "++total_train_steps=5" in replay.overrides  # resumes at 3, runs steps 3 and 4
    assert "++actor.trial_name=t_replay3" in replay.overrides
    assert replay.resharding == ["actor.backend=fsdp:d2p1t1"]


def test_a_checkpoint_past_the_step_says_it_cannot_be_used(tmp_path: Path) -> None:
    original = config(tmp_path)
    info = recover_info_dir(original.raw)
    assert info is not None
    info.mkdir(parents=True)
    (info / "step_info.json").write_text(json.dumps({"global_step": 5}))
    replay = areal_replay(original, "t_replay3", [3])
    assert replay.weights.endswith(
        "the recover checkpoint holds step 5, not 2 (AReaL keeps the newest)"
    )
    assert "replay --from" not in replay.weights  # no earlier step reaches it
    assert "++total_train_steps=1" in replay.overrides
    assert "++recover.trial_name=t_replay3" in replay.overrides  # writes under its own trial
