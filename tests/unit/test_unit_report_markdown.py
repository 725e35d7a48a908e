"""report.md, the page a person opens first: the verdict in bold, the culprits, the tables of
stack groups, ranks and inference servers, the collective record, the replay and where the
files are. Rendered from reports built on recorded evidence of real hangs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from areal_watchdog.diagnose.classify import classify
from areal_watchdog.evidence.model import Evidence
from areal_watchdog.report.build import IncidentContext, build_report
from areal_watchdog.report.markdown import render_markdown

DATA = Path(__file__).resolve().parents[1] / "data"
INCIDENT = "20261122T000000Z-x-abcd"
REPLAY = {"step": 7, "replay_command": "areal-launch replay /runs/r1 --step 7"}


def report(name: str, **ctx: Any) -> dict[str, Any]:
    evidence = Evidence.from_dict(json.loads((DATA / name).read_text()))
    context = IncidentContext(
        "local",
        "rid",
        "/runs/r1",
        evidence.world_size,
        ["vm"],
        "exp",
        "t1",
        detected_at=1795000000.0,
        **ctx,
    )
    return build_report(INCIDENT, classify(evidence), evidence, context)


def lines(name: str, **ctx: Any) -> list[str]:
    return render_markdown(report(name, **ctx)).splitlines()


def section(text: list[str], title: str) -> list[str]:
    """The lines of one ``## title`` section, up to the next one."""
    start = text.index(f"## {title}") + 1
    end = next((i for i in range(start, len(text)) if text[i].startswith("## ")), len(text))
    return [line for line in text[start:end] if line]


def test_the_header_names_the_verdict_and_its_culprits() -> None:
    text = lines("evidence/collective_mismatch_w4_r2.json", last_step=41)
    assert text[0] == "# Hang report: `collective_mismatch`"
    assert text[2].startswith("**Rank 2 is blocked in broadcast") and text[2].endswith("**")
    assert "- Culprit ranks: 2; nodes: vm" in text
    assert "- Job: exp/t1 (local), world size 4, nodes vm" in text
    assert any(line.startswith("- Detected: ") and line.endswith("; last step 41") for line in text)
    assert not any(line.startswith("## Inference servers") for line in text)
    assert not any(line.startswith("## Replay") for line in text)


def test_groups_and_ranks_are_tables_with_one_row_each() -> None:
    text = lines("evidence/collective_mismatch_w4_r2.json")
    groups = section(text, "Stack groups")
    assert groups[:2] == ["| ranks | kind | where |", "|---|---|---|"]
    assert [row.split(" | ")[0] for row in groups[2:]] == ["| 0-1, 3", "| 2"]
    ranks = section(text, "Ranks")[2:]
    assert [row.split(" | ")[0] for row in ranks] == ["| 0", "| 1", "| 2", "| 3"]
    assert all(" | blocked | py-spy | MainThread | `" in row for row in ranks)


def test_an_exited_rank_shows_its_exit_code() -> None:
    ranks = section(lines("evidence/rank_crashed_w2_r1.json"), "Ranks")[2:]
    assert ranks[0].startswith("| 0 | vm | 6567 | exited (1) | none | - | `raised RuntimeError")
    assert ranks[1].startswith("| 1 | vm | 6568 | exited (0) |")


def test_a_rollout_stall_shows_its_cause_servers_and_why_a_replay_cannot_reproduce_it() -> None:
    text = lines("rollout/inference_paused.json", trajectory=REPLAY)
    assert "- Culprit ranks: none named; nodes: -" in text
    assert "- Cause: `inference_paused`" in text
    assert "- Culprit workers: inference_server 127.0.0.1:30817 (up)" in text
    servers = section(text, "Inference servers")
    assert servers[0].startswith("| address | state | engine |")
    assert servers[2] == "| 127.0.0.1:30817 | up | - | 0.0028 | 0.0 | 6.0 | 4.069 | True | - |"
    replay = section(text, "Replay")
    assert replay[0] == "Last dumped step: 7"
    assert "areal-launch replay /runs/r1 --step 7" in replay
    assert replay[-1] == "A replay has no rollout: it retrains the dumped batch, not this stall."


def test_a_replay_of_a_training_hang_has_no_rollout_warning() -> None:
    replay = section(lines("evidence/collective_mismatch_w4_r2.json", trajectory=REPLAY), "Replay")
    assert replay[0] == "Last dumped step: 7"
    assert not any("has no rollout" in line for line in replay)


def test_the_collective_record_is_a_nested_list() -> None:
    text = lines("evidence/straggler_w4_r3--moe-uneven-all-to-all.json")
    assert section(text, "Collectives (Flight Recorder)") == [
        "- group 0 (default_pg): ranks 0-2 at #5 all_to_all; rank 3 at #4 all_reduce",
        "  - rank 3 never issued collective #5 (all_to_all) of group 0 (default_pg) that ranks "
        "0-2 wait in",
        "- the stacks and the collective record name the same ranks",
    ]


def test_the_files_section_points_into_the_incident_directory() -> None:
    files = section(lines("evidence/collective_mismatch_w4_r2.json"), "Files")
    base = f"/runs/r1/incidents/{INCIDENT}"
    assert files == [
        f"- Stacks: `{base}/stacks`",
        f"- Log tails: `{base}/logs`",
        f"- Raw evidence: `{base}/evidence.json`",
    ]


def test_a_cut_rank_table_says_how_many_are_shown_and_where_the_rest_are() -> None:
    data = report("evidence/collective_mismatch_w4_r2.json")
    data["ranks_total"] = 4096
    data["files"]["ranks_by_node"] = "/runs/r1/ranks_by_node"
    text = render_markdown(data)
    assert "4 of 4096 ranks shown (culprits, the first of every stack group, the exited)" in text
    assert "every rank of a node is in `/runs/r1/ranks_by_node`" in text


def test_no_step_yet_reads_as_words_not_none() -> None:
    detected = next(
        line for line in lines("evidence/init_deadlock_w3_r1.json") if line.startswith("- Det")
    )
    assert "None" not in detected
