"""What ``areal-launch diagnose`` prints: the first line (category, cause, culprits,
confidence), the stack groups and the collective record, indented; and the ``--json`` object
scripts read. Verdicts come from recorded evidence of real hangs."""

from __future__ import annotations

import json
from pathlib import Path

from areal_watchdog.diagnose.classify import classify
from areal_watchdog.diagnose.render import collective_lines, verdict_dict, verdict_text
from areal_watchdog.diagnose.verdict import StackGroup, Verdict
from areal_watchdog.evidence.model import Evidence

EVIDENCE = Path(__file__).resolve().parents[1] / "data" / "evidence"


def recorded(name: str) -> Verdict:
    return classify(Evidence.from_dict(json.loads((EVIDENCE / name).read_text())))


def test_the_first_line_names_category_culprit_ranks_and_workers() -> None:
    lines = verdict_text(recorded("weight_sync_stuck_w2_r0.json")).splitlines()
    assert lines[0] == (
        "weight_sync_stuck: culprit ranks 0, culprit workers inference_server "
        "127.0.0.1:30817 (up), confidence 0.85"
    )
    assert lines[1].startswith("Rank 0 is blocked sending weights")


def test_a_cause_and_no_culprit_are_said_plainly() -> None:
    verdict = Verdict("rollout_stalled", 0.9, [], "Ranks 0-1 are waiting.", cause="reward_stuck")
    assert verdict_text(verdict) == (
        "rollout_stalled (reward_stuck): culprit ranks none named, confidence 0.90\n"
        "Ranks 0-1 are waiting."
    )


def test_the_collective_record_follows_the_groups_its_findings_indented() -> None:
    text = verdict_text(recorded("straggler_w4_r3--moe-uneven-all-to-all.json"))
    lines = text.splitlines()
    assert lines[2] == "stack groups:"
    assert lines[3].startswith("  ranks 0-2: collective, all_to_all_single at ")
    record = lines.index("collective record:")
    assert lines[record + 1 :] == [
        "  group 0 (default_pg): ranks 0-2 at #5 all_to_all; rank 3 at #4 all_reduce",
        "    rank 3 never issued collective #5 (all_to_all) of group 0 (default_pg) that ranks "
        "0-2 wait in",
        "  the stacks and the collective record name the same ranks",
    ]


def test_collective_lines_say_which_ranks_sent_no_trace() -> None:
    record = {
        "groups": [
            {
                "group": "0",
                "table": ["ranks 0-2 at #3 all_reduce"],
                "kind": "agree",
                "description": "every rank of group 0 issued collective #3 (all_reduce)",
            },
        ],
        "ranks_without_trace": [3, 4],
        "agreement": "the collective record names no rank",
    }
    # an agreeing group's description is not repeated under it: only findings are
    assert collective_lines(record) == [
        (0, "group 0: ranks 0-2 at #3 all_reduce"),
        (0, "no trace from ranks 3-4"),
        (0, "the collective record names no rank"),
    ]


def test_the_json_object_is_the_verdict_with_its_groups_and_source() -> None:
    verdict = recorded("collective_mismatch_w2_r0-1--two-rank-tie.json")
    data = json.loads(json.dumps(verdict_dict(verdict, {"kind": "incident", "path": "/x"})))
    assert (data["category"], data["culprit_ranks"], data["confidence"]) == (
        "collective_mismatch",
        [0, 1],
        0.45,
    )
    assert data["source"] == {"kind": "incident", "path": "/x"}
    assert [g["ranks"] for g in data["groups"]] == [[0], [1]]
    assert {g["kind"] for g in data["groups"]} == {"collective"}
    assert (
        data["collectives"]["agreement"]
        == "the stacks and the collective record name the same ranks"
    )


def test_confidence_is_rounded_in_the_json_and_the_text_alike() -> None:
    verdict = Verdict("straggler", 0.8333, [3], "Rank 3 is late.")
    assert verdict_dict(verdict, {})["confidence"] == 0.83
    assert verdict_text(verdict).splitlines()[0].endswith("confidence 0.83")


def test_a_stack_group_of_one_rank_says_rank() -> None:
    verdict = Verdict(
        "straggler", 0.8, [3], "s", groups=[StackGroup("sig", "at x", "running", [3])]
    )
    assert "  rank 3: running, at x" in verdict_text(verdict).splitlines()
