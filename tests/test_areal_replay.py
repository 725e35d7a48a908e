"""What a replay of an AReaL run starts from, and what it may write: planned from a run
directory in AReaL's layout (the real runs are in test_areal.py)."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

import pytest
import yaml
from test_trajectory import record

from areal_watchdog.cli import main
from areal_watchdog.config.load import load_config
from areal_watchdog.trajectory.replay.replay_plan import ReplayRequest, plan_replay_config

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "areal" / "gsm8k_grpo.yaml"


def areal_run(root: Path, recover: str, saved_step: int | None) -> Path:
    """A single-controller AReaL run that dumped steps 0-3 and, if ``saved_step`` is given,
    left AReaL's recover info of that step."""
    config = load_config(
        CONFIG, [f"cluster.fileroot={root}", "trial_name=t", f"recover.mode={recover}"]
    )
    config.raw["launch"]["entrypoint"] = str(CONFIG.with_name("gsm8k_rl.py"))
    run = root / "gsm8k-grpo" / "t"
    (run / "watchdog").mkdir(parents=True)
    (run / "watchdog" / "launch_config.yaml").write_text(yaml.safe_dump(config.raw))
    record(run / "debug_trajectories", range(4))
    if saved_step is not None:
        info = root / "checkpoints" / getpass.getuser() / "gsm8k-grpo" / "t" / "recover_info"
        info.mkdir(parents=True)
        (info / "step_info.json").write_text(json.dumps({"epoch": 0, "global_step": saved_step}))
    return run


def weights_line(run: Path, step: int, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["replay", str(run), "--step", str(step), "--dry-run"]) == 0
    return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("weights"))


def test_the_step_after_the_recover_checkpoint_starts_from_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = areal_run(tmp_path, "auto", saved_step=2)
    assert "AReaL's recover checkpoint of step 2 (" in weights_line(run, 3, capsys)
    replay = plan_replay_config(ReplayRequest(run, step=3))
    raw = replay.config.raw
    # It reads the original trial's checkpoint and writes everything else under its own trial.
    assert (raw["recover"]["mode"], raw["recover"]["trial_name"]) == ("auto", "t")
    for section in ("actor", "rollout", "saver", "stats_logger", "evaluator"):
        assert raw[section]["trial_name"] == "t_replay3", section
    assert raw["total_train_steps"] == 4  # AReaL resumes at step 3 and runs one step


def test_other_steps_say_why_they_start_from_the_initial_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = areal_run(tmp_path, "auto", saved_step=0)
    assert "as the run had at step 0" in weights_line(run, 0, capsys)
    assert "holds step 0, not 2 (AReaL keeps the newest); replay --from 1" in weights_line(
        run, 3, capsys
    )
    plain = areal_run(tmp_path / "off", "disabled", saved_step=None)
    line = weights_line(plain, 2, capsys)
    assert "initial weights (actor.path): the run saved no recover checkpoint" in line
    assert "recover.mode: disabled" in line
    raw = plan_replay_config(ReplayRequest(plain, step=2)).config.raw
    assert raw["recover"]["trial_name"] == "t_replay2" and raw["total_train_steps"] == 1


def test_nproc_sets_the_data_parallel_size_of_the_actor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = areal_run(tmp_path, "disabled", saved_step=None)
    raw = plan_replay_config(ReplayRequest(run, step=1, nproc=2)).config.raw
    assert raw["actor"]["backend"] == "fsdp:d2"  # recorded on fsdp:d1, no config-change error
    launch_config = run / "watchdog" / "launch_config.yaml"
    launch_config.write_text(launch_config.read_text().replace("fsdp:d1", "fsdp"))
    assert main(["replay", str(run), "--step", "1", "--nproc", "2", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--nproc 2: actor.backend 'fsdp' has no single d<N> to change" in err
    assert "Traceback" not in err


def test_groups_pick_rows_of_one_step_padded_with_the_step_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a bisection replays: some groups of the hung step, padded with the groups of the
    step before (they trained), so that every data-parallel rank still gets work."""
    from areal_watchdog.trajectory.reader import Replay

    run = areal_run(tmp_path, "disabled", saved_step=None)
    launch_config = run / "watchdog" / "launch_config.yaml"
    text = launch_config.read_text()
    launch_config.write_text(text.replace("on_hang: cancel", "on_hang: resume"))
    replay = plan_replay_config(ReplayRequest(run, step=2, groups=(1,)))
    assert replay.config.watchdog.on_hang == "cancel"  # a replay that hangs ends: nothing resumes
    env = replay.config.launch.env
    assert env["AREAL_WATCHDOG_REPLAY_GROUPS"] == env["AREAL_WATCHDOG_REPLAY_PAD_STEP"] == "1"
    assert replay.config.trial_name == "t_replay2_g1"
    assert env["AREAL_WATCHDOG_REPLAY_PAD_TO"] == "1"  # the actor's fsdp:d1
    fed = Replay(run / "debug_trajectories", [2], 0, 1, groups=[1], pad_step=1, pad_to=4)
    ((step, groups),) = list(fed.batches())
    assert step == 2 and [g["prompt_id"] for g in groups] == ["p20-1", "p10-0", "p10-1", "p10-0"]
    resharded = plan_replay_config(ReplayRequest(run, step=2, groups=(1,), nproc=2))
    assert resharded.config.launch.env["AREAL_WATCHDOG_REPLAY_PAD_TO"] == "2"
    assert main(["replay", str(run), "--step", "2", "--groups", "0,5", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("--groups: step 2 holds groups 0-1, not 5")
    assert main(["replay", str(run), "--from", "1", "--to", "2", "--groups", "0", "--dry-run"]) == 2
    assert "--groups picks groups of one step" in capsys.readouterr().err
