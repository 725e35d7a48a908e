"""The Flight Recorder record on its own (``areal-launch diagnose DIR``): which process group
diverged, which rank is behind, and the sentence users read. Recorded dumps of real gloo hangs
(``tests/data/flight_recorder``, in each format torch writes) and small hand-made records for
the cases no hang recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from areal_watchdog.diagnose.collective_traces.collectives import analyse
from areal_watchdog.diagnose.collective_traces.dumps_only import record_finding
from areal_watchdog.evidence.listeners.flight_recorder import parse_trace

DUMPS = Path(__file__).resolve().parents[1] / "data" / "flight_recorder"
TRUTH: dict[str, dict[str, Any]] = json.loads((DUMPS / "truth.json").read_text())


def recorded(name: str, fmt: str = "json") -> dict[int, dict[str, Any]]:
    """One recorded hang's dumps by rank, in one of the formats torch writes."""
    dumps = {}
    for path in sorted((DUMPS / name / fmt).iterdir()):
        trace = parse_trace(path.read_bytes())
        assert trace is not None, path
        dumps[int(path.name.split("_")[1].split(".")[0])] = trace
    return dumps


def entry(
    seq: int,
    op: str,
    sizes: list[list[int]],
    *,
    out: list[list[int]] | None = None,
    done: bool = False,
) -> dict[str, Any]:
    """One collective of the default group, as a JSON dump lists it."""
    return {
        "collective_seq_id": seq,
        "profiling_name": f"nccl:{op}",
        "process_group": ["0", "default_pg"],
        "pg_id": 0,
        "input_sizes": sizes,
        "output_sizes": sizes if out is None else out,
        "input_dtypes": ["Float"],
        "output_dtypes": ["Float"],
        "retired": done,
        "state": "completed" if done else "scheduled",
    }


def dump(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"entries": list(entries), "pg_status": {}, "pg_config": {}}


@pytest.mark.parametrize("fmt", ["json", "pickle", "active"])
@pytest.mark.parametrize("name", sorted(TRUTH))
def test_each_recorded_hang_names_the_rank_in_every_dump_format(name: str, fmt: str) -> None:
    """NCCL pickles key ``pg_status`` by int, JSON by string: the record must read the same."""
    dumps = recorded(name, fmt)
    finding = record_finding(analyse(dumps, len(dumps)))
    truth = TRUTH[name]
    assert (finding.category, finding.culprit_ranks) == (truth["category"], truth["culprit_ranks"])
    assert ("a tie" in finding.summary) == truth.get("tie", False), finding.summary


def test_a_minority_collective_is_named_with_what_each_side_issued() -> None:
    record = analyse(recorded("mismatch_w4_r2"), 4)
    (mismatch,) = [g for g in record.groups if g.kind == "mismatch"]
    assert (mismatch.group, mismatch.first_incomplete, mismatch.culprit_ranks) == ("1", 3, [2])
    assert mismatch.table == ["ranks 0-1, 3 at #3 all_reduce", "rank 2 at #3 broadcast"]
    assert record.decisive_mismatch is mismatch
    assert record_finding(record).summary == (
        "The collective record shows that at collective #3 of group 1, rank 2 issued broadcast "
        "of [[1]] Float while ranks 0-1, 3 issued all_reduce of [[1]] Float: rank 2 diverged."
    )


def test_a_rank_that_waits_in_another_group_is_a_victim_not_the_straggler() -> None:
    """Pairs [0, 1] and [2, 3] and the world: rank 3 stalls; rank 2 waits for it in the pair's
    group and is therefore missing from the world's collective too, but only as a victim."""
    record = analyse(recorded("pairs_w4_r3"), 4)
    missing = {g.group: g for g in record.groups if g.kind == "missing"}
    assert missing["2"].culprit_ranks == [3] and missing["2"].waiting == [2]
    assert missing["3"].culprit_ranks == [3]
    assert "(rank 2 waits in another group's collective)" in missing["3"].description
    assert record.culprit_ranks == [3]


def test_a_rank_without_a_dump_is_said_and_the_record_still_names_the_culprit() -> None:
    dumps = recorded("mismatch_w4_r2")
    del dumps[3]
    record = analyse(dumps, 4)
    finding = record_finding(record)
    assert record.ranks_without_trace == [3]
    assert (finding.category, finding.culprit_ranks) == ("collective_mismatch", [2])
    assert finding.summary.endswith(" No dump from rank 3 (dead, or its dump was not written).")


def test_all_to_all_totals_that_disagree_are_a_mismatch_naming_no_rank() -> None:
    """Per-rank sizes of an all_to_all legally differ (MoE routing); only the totals must
    agree, and the record cannot tell whose split is wrong."""
    dumps = {
        0: dump(entry(1, "all_to_all_single", [[4]], out=[[6]])),
        1: dump(entry(1, "all_to_all_single", [[6]], out=[[6]])),
    }
    record = analyse(dumps, 2)
    (group,) = record.groups
    assert (group.kind, group.culprit_ranks) == ("mismatch", [])
    assert "send 10 elements in total but expect 12" in group.description
    finding = record_finding(record)
    assert (finding.category, finding.confidence, finding.culprit_ranks) == (
        "collective_mismatch",
        0.4,
        [],
    )


def test_uneven_but_balanced_all_to_all_is_no_mismatch() -> None:
    dumps = {
        0: dump(entry(1, "all_to_all_single", [[4]], out=[[6]])),
        1: dump(entry(1, "all_to_all_single", [[8]], out=[[6]])),
    }
    (group,) = analyse(dumps, 2).groups
    assert group.kind == "agree"
    assert group.description == (
        "every rank of group 0 (default_pg) issued collective #1 (all_to_all_single)"
    )


def test_every_rank_in_the_same_unfinished_collective_is_stuck_and_a_finished_record_unknown() -> (
    None
):
    waiting = {r: dump(entry(1, "all_reduce", [[8]]), entry(2, "barrier", [[1]])) for r in (0, 1)}
    stuck = record_finding(analyse(waiting, 2))
    assert (stuck.category, stuck.culprit_ranks) == ("collective_stuck", [])
    assert "issued collective #2 (barrier)" in stuck.summary

    finished = {r: dump(entry(1, "all_reduce", [[8]], done=True)) for r in (0, 1)}
    over = record_finding(analyse(finished, 2))
    assert over.category == "unknown"
    assert over.summary.startswith("Every collective in the record completed")


def test_ranks_waiting_for_each_other_across_groups_are_all_named() -> None:
    """Rank 0 waits in group 1, rank 1 in group 2: each is missing where the other waits, so
    no rank is the end of the chain: collectives issued in different orders."""

    def in_group(group: str, seq: int, done: bool) -> dict[str, Any]:
        return {
            **entry(seq, "all_reduce", [[1]], done=done),
            "process_group": [group, ""],
            "pg_id": int(group),
        }

    dumps = {
        0: dump(in_group("1", 1, False)),
        1: dump(in_group("2", 1, False)),
    }
    dumps[0]["pg_config"] = dumps[1]["pg_config"] = {
        "1": {"ranks": "[0, 1]"},
        "2": {"ranks": "[0, 1]"},
    }
    finding = record_finding(analyse(dumps, 2))
    assert (finding.category, finding.culprit_ranks) == ("collective_mismatch", [0, 1])
    assert "waiting for each other in different groups" in finding.summary
