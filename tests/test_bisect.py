"""The replay that decides a resume: the bisection that narrows a hanging batch to its rows,
and the quarantine that names them and leaves them out of the resumed run's data."""

from __future__ import annotations

from pathlib import Path

from areal_watchdog.common.rankset import parse_ranks
from areal_watchdog.launch.bisect import bisect
from areal_watchdog.trajectory.quarantine import QuarantinedRow, add_rows, is_quarantined


def hangs_with(*poisoned: int):
    """A stand-in replay: a subset hangs when it holds every poisoned group."""
    return lambda groups: set(poisoned) <= set(groups)


def test_one_poisoned_group_of_eight_is_found_in_three_halvings() -> None:
    found = bisect(tuple(range(8)), hangs_with(5), budget=10)
    assert found.groups == (5,)
    assert [t.groups for t in found.trials] == [(0, 1, 2, 3), (4, 5, 6, 7), (4, 5), (4,), (5,)]
    assert not found.budget_spent


def test_a_hang_that_needs_two_rows_stops_at_the_set_holding_both() -> None:
    found = bisect(tuple(range(8)), hangs_with(1, 6), budget=10)
    assert found.groups == tuple(range(8))  # neither half hangs alone
    assert [t.hung for t in found.trials] == [False, False]


def test_the_budget_and_the_data_parallel_floor_bound_the_replays() -> None:
    spent = bisect(tuple(range(8)), hangs_with(7), budget=2)
    assert (spent.groups, spent.budget_spent, len(spent.trials)) == ((4, 5, 6, 7), True, 2)
    floored = bisect(tuple(range(8)), hangs_with(7), budget=10, floor=2)
    assert floored.groups == (6, 7)  # each replay feeds two data-parallel ranks


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


def test_a_failed_replay_proves_nothing_and_stops_the_halving() -> None:
    outcomes = iter([False, None])
    found = bisect(tuple(range(4)), lambda _groups: next(outcomes), budget=10)
    assert (found.groups, found.failed, len(found.trials)) == ((0, 1, 2, 3), True, 2)


def test_group_lists_read_as_rank_lists() -> None:
    assert parse_ranks("0,2-4, 7") == (0, 2, 3, 4, 7)
