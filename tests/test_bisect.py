"""The replay that decides a resume: the bisection that narrows a hanging batch to its rows,
and the quarantine that names them and leaves them out of the resumed run's data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_watchdog.common.rankset import parse_ranks
from areal_watchdog.recover.bisect import bisect
from areal_watchdog.recover.policy import Hang
from areal_watchdog.rundir.layout import ENV_RUN_ID
from areal_watchdog.trajectory.quarantine import (
    ENV_QUARANTINE,
    QuarantinedRow,
    add_rows,
    is_quarantined,
    without_quarantined,
)

SYNC = "at all_reduce at train.py:160 in Trainer.sync_metrics()"
GRADS = "at all_reduce at train.py:152 in Trainer.average_gradients()"


def hangs_with(*poisoned: int):
    """A stand-in replay: a subset hangs when it holds every poisoned group."""
    return lambda groups: set(poisoned) <= set(groups)


def hangs_with_any(*poisoned: int):
    """A subset hangs when it holds any poisoned group (each hangs alone)."""
    return lambda groups: bool(set(poisoned) & set(groups))


def test_one_poisoned_group_of_eight_is_found_alone_within_five_replays() -> None:
    for poisoned in (2, 3, 4, 5, 6, 7):  # every group of a rank other than 0
        found = bisect(tuple(range(8)), hangs_with_any(poisoned), budget=5)
        assert (found.groups, found.unconfirmed) == ((poisoned,), ()), poisoned
    found = bisect(tuple(range(8)), hangs_with_any(5), budget=10)
    # the first half does not hang: the second is taken to, and confirmed at the end
    assert [t.groups for t in found.trials] == [(0, 1, 2, 3), (4, 5), (4,), (6, 7), (5,)]
    assert [t.hung for t in found.trials] == [False, True, False, False, True]


def test_a_hang_that_needs_two_rows_falls_back_to_the_set_holding_both() -> None:
    found = bisect(tuple(range(8)), hangs_with(1, 6), budget=10)
    assert found.groups == tuple(range(8))  # no smaller set hangs alone
    assert not any(t.hung for t in found.trials)


def test_both_halves_are_searched_when_both_hang() -> None:
    """Two poisoned rows, one in each half: both are found, with at most one healthy row
    when the budget runs out, none when it does not."""
    found = bisect(tuple(range(8)), hangs_with_any(1, 6), budget=10)
    assert (found.groups, found.budget_spent, found.unchecked) == ((1, 6), False, ())
    spent = bisect(tuple(range(8)), hangs_with_any(1, 6), budget=5)
    assert {1, 6} <= set(spent.groups) and len(spent.groups) <= 3 and spent.budget_spent
    assert spent.unchecked  # halves never probed for another hanging row: said


def test_a_hang_keyed_on_the_step_quarantines_nothing() -> None:
    """Every subset down to one group hangs, and so does a group of the step before: the hang
    follows the step, not the data."""
    found = bisect(tuple(range(8)), lambda _g: True, budget=5, trained_hangs=lambda: True)
    assert (found.groups, found.step_keyed) == ((), True)
    assert [t.trained for t in found.trials] == [False, False, False, True]
    data = bisect(tuple(range(8)), hangs_with_any(0), budget=5, trained_hangs=lambda: False)
    assert (data.groups, data.step_keyed) == ((0,), False)  # group 0 itself hangs


def test_the_budget_and_the_data_parallel_floor_bound_the_replays() -> None:
    spent = bisect(tuple(range(8)), hangs_with(7), budget=2)
    assert (spent.budget_spent, len(spent.trials)) == (True, 2)
    assert spent.groups == spent.unconfirmed == (6, 7)  # by elimination: said so
    floored = bisect(tuple(range(8)), hangs_with(7), budget=10, floor=2)
    assert floored.groups == (6, 7)  # each replay feeds two data-parallel ranks


def test_a_half_hanging_in_one_of_the_originals_sites_hangs_the_same_way() -> None:
    tie = Hang("i", "collective_mismatch", 4, "culprit ranks 0, 3", (SYNC, GRADS))
    half = Hang("j", "collective_mismatch", 4, "culprit ranks 3", (SYNC.replace("160", "161"),))
    elsewhere = Hang("k", "collective_mismatch", 4, "culprit ranks 3", ("at x.py:9 in other()",))
    straggler = Hang("l", "straggler", 4, "culprit ranks 3", (SYNC,))
    assert half.within(tie) and not half.like(tie)
    assert not elsewhere.within(tie) and not straggler.within(tie)


def test_a_quarantined_prompt_leaves_out_its_row_and_nothing_else(tmp_path: Path) -> None:
    question = "Tom has 13 apples and buys 7 more.<|doc_sep|>How many apples does Tom have?"
    prompt = f"<|im_start|>user\n{question}\nPlease answer.<|im_end|>\n<|im_start|>assistant\n"
    path = tmp_path / "quarantine.json"
    row = QuarantinedRow(step=2, group=1, incident_id="i", prompt=prompt)
    assert add_rows(path, [row]) == add_rows(path, [row]) == [row]  # kept once
    poisoned = {"messages": [{"role": "user", "content": question}], "answer": "#### 20"}
    healthy = {"messages": [{"role": "user", "content": "Tom has 4 apples. How many?"}]}
    assert is_quarantined(poisoned, [prompt])
    assert not is_quarantined(healthy, [prompt])  # "user" is in every prompt: too short
    assert "a training row is left out" in path.read_text()


def chat(question: str) -> dict:
    """A chat row whose system message every row shares."""
    return {"messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": question}], "answer": "42"}  # fmt: skip


CHAT_CONFIG = Path(__file__).resolve().parents[1] / "examples" / "chat_rl" / "config.yaml"
SYSTEM = "You are a careful math tutor. Answer with the number only, nothing else."


def test_a_shared_system_message_leaves_out_only_the_quarantined_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [chat(f"Question {i}: what is {i} plus 2?") for i in range(60)]
    prompt = f"<|system|>{SYSTEM}\n<|user|>Question 13: what is 13 plus 2?\n<|assistant|>"
    path = tmp_path / "quarantine.json"
    add_rows(path, [QuarantinedRow(step=2, group=5, incident_id="i", prompt=prompt)])
    monkeypatch.setenv(ENV_QUARANTINE, str(path))
    monkeypatch.setenv(ENV_RUN_ID, "run-2")
    monkeypatch.setenv("RANK", "0")
    kept = without_quarantined(rows)
    assert len(kept) == 59 and rows[13] not in kept
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [f"[areal-watchdog] quarantine: 1 row(s) of the training data left out, as "
                    f"{path} lists"]  # fmt: skip
    applied = json.loads((tmp_path / "quarantine_applied.json").read_text())
    assert (applied["run_id"], applied["left_out"], applied["rows"]) == ("run-2", 1, 60)


def test_a_match_of_many_rows_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A row of plain texts sharing a long instruction: the match would take every row."""
    instruction = "Please put your final answer within a box."
    rows = [{"question": f"Q{i}", "instruction": instruction} for i in range(20)]
    path = tmp_path / "quarantine.json"
    add_rows(path, [QuarantinedRow(2, 1, "i", f"Q3 {instruction}")])
    monkeypatch.setenv("RANK", "0")
    assert without_quarantined(rows, path) == rows
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "refused: the 1 quarantined prompt(s)" in line and "match 20 of 20 rows" in line
    assert json.loads((tmp_path / "quarantine_applied.json").read_text())["left_out"] == 0


def test_a_failed_replay_proves_nothing_and_stops_the_halving() -> None:
    outcomes = iter([True, None])
    found = bisect(tuple(range(4)), lambda _groups: next(outcomes), budget=10)
    assert (found.groups, found.failed, len(found.trials)) == ((0, 1), True, 2)


def test_group_lists_read_as_rank_lists() -> None:
    assert parse_ranks("0,2-4, 7") == (0, 2, 3, 4, 7)


def dumped_run(root: Path) -> Path:
    """A torchrun run of the chat example that dumped steps 2 and 3 (8 groups on 4 ranks)."""
    import torch
    import yaml

    from areal_watchdog.config.load import load_config
    from areal_watchdog.trajectory import TrajectoryRecorder

    config = load_config(CHAT_CONFIG, [f"cluster.fileroot={root}", "trial_name=t"])
    config.raw["launch"]["entrypoint"] = str(CHAT_CONFIG.with_name("train.py"))
    run = root / "chat-rl" / "t"
    (run / "watchdog").mkdir(parents=True)
    (run / "watchdog" / "launch_config.yaml").write_text(yaml.safe_dump(config.raw))
    for rank in range(4):
        recorder = TrajectoryRecorder(run / "debug_trajectories", dp_rank=rank, dp_size=4,
                                      world_size=4, beats=False)  # fmt: skip
        for step in (2, 3):
            recorder.record(step, [{"input_ids": torch.full((2, 3), 10 * step + 2 * rank + g)}
                                   for g in range(2)])  # fmt: skip
        recorder.close()
    return run


def test_bisection_replays_are_named_as_areal_allows_and_watched_from_their_first_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Trial names never hold '-' (AReaL refuses them); a replay of step 3 tells the watchdog
    at once that step 2 trained, so its stall threshold applies from the start; a group of
    the step before can be fed as the step (the check of a hang keyed on the step)."""
    from areal_watchdog.cli import main
    from areal_watchdog.rundir.layout import ENV_WATCH_DIR
    from areal_watchdog.rundir.progress import heartbeat
    from areal_watchdog.trajectory import Replay

    run = dumped_run(tmp_path)
    assert main(["replay", str(run), "--step", "3", "--groups", "0,2-3", "--dry-run"]) == 0
    assert "t_replay3_g0_2to3" in capsys.readouterr().out
    assert main(["replay", str(run), "--step", "3", "--groups", "0,1", "--dry-run"]) == 0
    assert "t_replay3_g0to1" in capsys.readouterr().out
    assert main(["replay", str(run), "--step", "3", "--groups", "0", "--groups-of", "2",
                 "--dry-run"]) == 0  # fmt: skip
    assert "t_replay3_g0of2" in capsys.readouterr().out
    monkeypatch.setattr(heartbeat, "_beacon", None)
    monkeypatch.setenv(ENV_WATCH_DIR, str(run / "watchdog"))
    monkeypatch.setenv(ENV_RUN_ID, "r1")
    monkeypatch.setenv("RANK", "0")
    fed = Replay(run / "debug_trajectories", [3], 0, 2, groups=[0], groups_of=2, pad_step=2,
                 pad_to=2)  # fmt: skip
    ((step, groups),) = list(fed.batches())
    assert step == 3 and [int(g["input_ids"][0, 0]) for g in groups] == [20]  # step 2's group 0
    beats = [p.name for p in (run / "watchdog").rglob("rank_0.step_*")]
    assert beats == ["rank_0.step_2.r1"]  # not "step_none": no start-up threshold


def test_a_torchrun_config_without_a_tokenizer_is_told_at_launch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from areal_watchdog.cli import main

    assert main(["--watchdog", "local", str(CHAT_CONFIG), "~tokenizer_path", "--dry-run"]) == 0
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"[areal-launch] warning: {CHAT_CONFIG}: tokenizer_path: ")
    assert main(["--watchdog", "local", str(CHAT_CONFIG), "--dry-run"]) == 0
    assert capsys.readouterr().err == ""  # named: nothing to say
