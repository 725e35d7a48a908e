"""``on_hang: resume`` on a user's own chat-data RL script (``examples/chat_rl``: torchrun, 4
ranks on gloo, 8 groups a step, rows sharing one system message): a poisoned row is bisected to
itself and only it is left out; two poisoned rows are both found; a hang keyed on the step
quarantines nothing and stops. Each real run serves several assertions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import REPO
from testkit.launcher import Launcher, LaunchResult
from testkit.reports import read_reports

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # two runs of replays each

CHAT_CONFIG = REPO / "examples" / "chat_rl" / "config.yaml"
FAST = ["watchdog.stall_timeout=4", "watchdog.poll_interval=0.25", "watchdog.startup_timeout=60"]
SECOND_LOOK_S = 4  # confirm_after auto: half the threshold, at least 2 s; gathering included


def questions(rows: list[dict]) -> list[str]:
    """Which dataset question each quarantined prompt holds."""
    return [re.search(r"Question (\d+):", r["prompt"]).group(1) for r in rows]


def assert_replays_watched_from_their_first_step(result: LaunchResult) -> None:
    """Every replay ran (trial names AReaL accepts) and every hung one was reported after the
    stall threshold, not the start-up one."""
    for hang in result.reports:
        for replay in hang["recovery"]["replays"]:
            assert replay["error"] is None and "-" not in Path(replay["run_dir"]).name, replay
            if replay["hung"]:
                (report,) = read_reports(Path(replay["run_dir"]))
                assert report["stall_threshold_s"] == 4  # the step before trained: no start-up
                assert report["stalled_for_s"] <= 4 + SECOND_LOOK_S, report["stalled_for_s"]


def test_poisoned_rows_are_bisected_and_only_they_are_left_out(launcher: Launcher) -> None:
    """Row 21 (step 3, rank 2) hangs its rank; after it is quarantined the rows move up one
    place and rows 34 and 39 land in step 5 on ranks 0 and 3: both are found."""
    result = launcher.run(
        [*FAST, "data.poisoned=[21,34,39]"], config=CHAT_CONFIG, trial="rows", timeout=900
    )
    assert result.returncode == 0, result.output[-4000:]
    assert "after 2 resume(s) the job completed" in result.output
    first, second = result.reports
    assert (first["category"], first["culprit_ranks"]) == ("collective_mismatch", [2])
    one = first["recovery"]
    assert questions(one["rows_skipped"]) == ["21"]
    assert one["narrowed"]["to"] == [5] and one["narrowed"]["replays"] <= 5
    assert one["rows_left_out"] == 1  # what the resumed run's filter removed
    two = second["recovery"]
    assert {"34", "39"} <= set(questions(two["rows_skipped"]))
    assert len(two["rows_skipped"]) <= 3  # at most one healthy row beside them
    assert two["rows_left_out"] == 1 + len(two["rows_skipped"])  # the whole file, 64 rows read
    assert_replays_watched_from_their_first_step(result)
    markdown = Path(first["files"]["report_md"]).read_text()
    assert "replay(s) narrowed the 8 groups to 1: groups [5]." in markdown
    assert "The resumed run's filter removed 1 row(s) of its training data" in markdown
    record = json.loads((result.run_dir / "watchdog" / "recovery.json").read_text())
    assert [a["rows_left_out"] for a in record["attempts"]] == [1, two["rows_left_out"]]
    assert record["outcome"] == "completed"
    # a resumed run names the first step it trained, not a later one seen in the same poll
    for done in re.findall(r"resuming from \S+: (\d+) steps done", result.output):
        after = result.output.split(f": {done} steps done", 1)[1]
        seen = re.search(r"(?:first|last) step seen: step (\d+)", after)  # last: the final one
        assert seen.group(1) == str(int(done) + 1), after[:2000]


def test_a_hang_keyed_on_the_step_quarantines_nothing_and_stops(launcher: Launcher) -> None:
    """Rank 1 evaluates alone at step 2, whatever the data: every subset hangs, and so does a
    group of step 1 fed as step 2. Nothing is quarantined; the launcher stops at once."""
    result = launcher.run(
        [*FAST, "rl.eval_step=2", "rl.steps=3"], config=CHAT_CONFIG, trial="step", timeout=600
    )
    assert result.returncode == 3, result.output[-4000:]
    (report,) = result.reports
    recovery = report["recovery"]
    assert recovery["decision"] == "stop" and recovery["rows_skipped"] == []
    assert "the hang follows the step (or the code), not the data" in recovery["reason"]
    assert "nothing is quarantined" in result.output and "resuming in" not in result.output
    assert recovery["narrowed"]["step_keyed"]
    trained = [r for r in recovery["replays"] if r["groups_of"] == 1]
    assert len(trained) == 1 and trained[0]["hung"]
    assert not (result.run_dir / "quarantine.json").exists()
    assert_replays_watched_from_their_first_step(result)
    assert (
        "the hang follows the step, nothing is quarantined"
        in Path(report["files"]["report_md"]).read_text()
    )
