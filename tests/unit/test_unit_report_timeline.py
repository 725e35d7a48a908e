"""A hang's timeline, read as data (``timeline.json``), not as pixels: the culprit's row, the
stall, the looks and the lanes, on the H200's recorded NVML samples; the picture within
Slack's limits; report.md's line replaced; a history that was damaged read without a traceback;
past 64 ranks a row per group."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from areal_watchdog.evidence.gpu import GpuSample
from areal_watchdog.report.markdown import TIMELINE_PENDING
from areal_watchdog.report.picture import main as picture_main
from areal_watchdog.report.timeline import timeline
from areal_watchdog.rundir.progress.history import (
    GPU_SAMPLES_KEPT,
    NODE_LANES,
    NODE_SAMPLES_KEPT,
    History,
)

H200 = Path(__file__).resolve().parents[1] / "data" / "gpu" / "h200" / "nvml_samples.jsonl"
LAST_STEP_AT = 1_800_000_000.0


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds")


def report(world: int = 4, culprit: int = 3, by: str = "second_look") -> dict:
    ranks = [
        {"rank": r, "node": f"node{r // 2}", "state": "blocked",
         "where": "announce_metrics > broadcast" if r == culprit else "sync_metrics > all_reduce"}
        for r in range(world)
    ]  # fmt: skip
    return {
        "category": "collective_mismatch", "culprit_ranks": [culprit], "last_step": 9,
        "last_progress_at": iso(LAST_STEP_AT), "detected_at": iso(LAST_STEP_AT + 6.0),
        "stalled_for_s": 6.0, "stall_threshold_s": 5.0, "ranks": ranks,
        "groups": [
            {"ranks": [r for r in range(world) if r != culprit], "kind": "blocked",
             "where": "sync_metrics > all_reduce"},
            {"ranks": [culprit], "kind": "blocked", "where": "announce_metrics > broadcast"},
        ],
        "confirmation": {"by": by, "after_s": 2.6, "posted": True, "cancel_after_s": 600.0},
        "servers": [{"address": "127.0.0.1:30000", "gen_throughput": 0.0, "queued": 4}],
    }  # fmt: skip


def history() -> History:
    """Steps every second up to the last, and the H200's samples laid over the same seconds."""
    kept = History("node0")
    for step in range(1, 10):
        kept.note_step(step, LAST_STEP_AT - 9 + step)
    for line in H200.read_text().splitlines():
        frame = json.loads(line)
        kept.note_gpus(LAST_STEP_AT - 8 + frame["t"], [GpuSample(**g) for g in frame["gpus"]])
    return kept


def test_the_timeline_shows_the_culprit_the_stall_and_each_look() -> None:
    earlier = [{**report(), "stalled_for_s": 5.1, "confirmation": {"posted": False}}]
    data = timeline(report(), history(), earlier)
    culprit = [row for row in data["rows"] if row["culprit"]]
    assert [row["label"] for row in culprit] == ["rank 3"] and culprit[0]["node"] == "node1"
    assert [row["label"] for row in data["rows"]] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert data["stall"] == {"from": 0.0, "to": 6.0} and data["last_step"] == 9
    kinds = [(look["kind"], look["t"]) for look in data["looks"]]
    assert kinds == [("suspected", 5.1), ("first look", 6.0), ("second look", 8.6)]
    assert [s["step"] for s in data["steps"]][-1] == 9 and data["steps"][-1]["t"] == 0.0
    lanes = {lane["name"]: lane for lane in data["lanes"]}
    power = lanes["GPU 0 (node0) power W"]["points"]
    assert max(p[1] for p in power) > 500  # the H200 at work, as recorded
    assert lanes["server 127.0.0.1:30000 queued"]["points"] == [[5.1, 4.0], [6.0, 4.0]]


def test_proof_and_the_hard_limit_are_each_one_mark() -> None:
    proof = timeline(report(by="evidence"), History(), [])
    assert [look["kind"] for look in proof["looks"]] == ["proof"]
    limit = timeline(report(by="hard_limit"), History(), [])
    assert [(look["kind"], look["t"]) for look in limit["looks"]] == [("hard limit", 600.0)]


def test_past_64_ranks_a_row_per_group_with_the_culprits_apart() -> None:
    data = timeline(report(world=128, culprit=77), History(), [])
    assert [(row["label"], row["culprit"]) for row in data["rows"]] == [
        ("ranks 0-76, 78-127", False),
        ("rank 77", True),
    ]


def test_a_damaged_history_is_read_as_what_survives() -> None:
    steps = [{"t": 1.0, "step": 2}, {"t": "x"}, 5]
    gpus = [{"t": 1.0, "index": 0, "utilization": True}, None]
    kept = History.from_dict({"node": "n", "steps": steps, "gpus": gpus})
    assert list(kept.steps) == [(1.0, 2)] and not kept.gpus
    assert History.from_dict("not a history").to_dict()["steps"] == []


def test_the_history_is_bounded() -> None:
    kept = History()
    for i in range(GPU_SAMPLES_KEPT * 3):
        kept.note_gpus(float(i), [GpuSample(0, "GPU-0", 50.0, 1.0, 2.0, 300.0, 700.0)])
    assert len(kept.gpus) == GPU_SAMPLES_KEPT and kept.gpus[0][0] == GPU_SAMPLES_KEPT * 2


def test_the_picture_is_drawn_within_slacks_limits_and_put_in_report_md(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    incident = tmp_path / "incidents" / "20261128T000000Z-collective_mismatch-abcd"
    incident.mkdir(parents=True)
    (incident / "report.json").write_text(json.dumps(report()))
    (incident / "history.json").write_text(json.dumps(history().to_dict()))
    (incident / "report.md").write_text(f"# Hang report\n\n## Timeline\n\n{TIMELINE_PENDING}\n")
    assert picture_main([str(incident)]) == 0
    data = json.loads((incident / "timeline.json").read_text())
    assert data["culprit_ranks"] == [3]
    png = (incident / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) < 1_000_000
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width <= 1200 and height <= 2000  # Slack previews it whole
    assert "rank 3 (culprit)" in (incident / "timeline.svg").read_text()
    md = (incident / "report.md").read_text()
    assert "![timeline](timeline.svg)" in md and TIMELINE_PENDING not in md


def test_without_matplotlib_report_md_says_how_to_get_the_picture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # import fails
    incident = tmp_path / "incidents" / "x"
    incident.mkdir(parents=True)
    (incident / "report.json").write_text(json.dumps(report()))
    (incident / "report.md").write_text(f"## Timeline\n\n{TIMELINE_PENDING}\n")
    assert picture_main([str(incident)]) == 0
    md = (incident / "report.md").read_text()
    assert "pip install 'areal-watchdog[plots]'" in md and (incident / "timeline.json").exists()
    assert not (incident / "timeline.png").exists()


def test_areal_processes_are_rows_and_a_culprit_worker_is_named_by_its_process() -> None:
    areal = {
        **report(),
        "culprit_ranks": [],
        "ranks": [{"rank": 0, "role": "actor", "pid": 11, "node": "n", "state": "blocked"}],
        "workers": [
            {"role": "rollout", "index": 0, "pid": 12, "node": "n", "state": "blocked"},
            {
                "role": "inference_server",
                "address": "127.0.0.1:3000",
                "pid": 13,
                "state": "blocked",
            },
        ],
        "culprit_workers": [{"role": "inference_server", "address": "127.0.0.1:3000", "pid": 13}],
    }
    data = timeline(areal, History(), [])
    assert [(row["label"], row["culprit"]) for row in data["rows"]] == [
        ("rank 0 (actor)", False),
        ("rollout 0", False),
        ("inference_server 127.0.0.1:3000", True),
    ]


def test_the_jobs_gpus_at_work_are_one_lane_summed_over_the_nodes_statuses() -> None:
    kept = History("node0")
    for t, working in ((LAST_STEP_AT - 1, 16), (LAST_STEP_AT + 2, 0)):
        statuses = [{"pace": {"gpus": 8, "gpus_working": working // 2}} for _ in range(2)]
        kept.note_job_gpus(t, [*statuses, {"pace": "damaged"}, {}])
    (lane,) = timeline(report(), History.from_dict(kept.to_dict()), [])["lanes"][:1]
    assert lane["name"] == "GPUs working, all nodes (of 16)"
    assert lane["points"] == [[-1.0, 16.0], [2.0, 0.0]]


def test_each_node_is_a_lane_up_to_a_bound_and_its_memory_stays_bounded() -> None:
    kept = History("node00")
    for poll in range(NODE_SAMPLES_KEPT + 5):
        statuses = [{"node": f"node{n:02d}", "gpu_use": {"utilization": 90.0, "power_w": 4800.0}}
                    for n in range(NODE_LANES + 8)]  # fmt: skip
        kept.note_job_gpus(LAST_STEP_AT + 3 - (NODE_SAMPLES_KEPT + 4) + poll, statuses)
    assert len(kept.nodes) == NODE_LANES
    assert {len(samples) for samples in kept.nodes.values()} == {NODE_SAMPLES_KEPT}
    lanes = timeline(report(), History.from_dict(kept.to_dict()), [])["lanes"]
    names = [lane["name"] for lane in lanes if lane["name"].startswith("node ")]
    assert "node node01 GPUs power W" in names and len(names) == 2 * NODE_LANES
    node01 = next(lane for lane in lanes if lane["name"] == "node node01 GPUs utilization %")
    assert node01["points"][0] == [-5.0, 90.0] and node01["points"][-1] == [3.0, 90.0]


def test_with_no_step_yet_the_stall_runs_from_about_the_start_to_the_look() -> None:
    stuck = {**report(by="evidence"), "last_progress_at": None, "stalled_for_s": None,
             "last_step": None, "stall_threshold_s": 20.0}  # fmt: skip
    data = timeline(stuck, History(), [])
    assert data["since"] == "start" and data["stall"] == {"from": 0.0, "to": 20.0}
    assert data["origin"] == LAST_STEP_AT + 6.0 - 20.0  # the look's time less its silence
    assert [(look["kind"], look["t"]) for look in data["looks"]] == [("proof", 20.0)]


def test_a_folder_without_a_readable_report_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "report.json").write_text("{half")
    assert picture_main([str(tmp_path)]) == 2 and picture_main([]) == 2
    assert capsys.readouterr().err.startswith("usage: python -m areal_watchdog.report.picture")


def test_a_link_planted_where_the_picture_goes_is_replaced_never_followed(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    incident = tmp_path / "incidents" / "x"
    incident.mkdir(parents=True)
    (incident / "report.json").write_text(json.dumps(report()))
    (incident / "report.md").write_text(f"{TIMELINE_PENDING}\n")
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    for name in ("timeline.png", "timeline.svg", "timeline.json"):
        (incident / name).symlink_to(victim)
    assert picture_main([str(incident)]) == 0
    assert victim.read_text() == "keep me"
    assert not any((incident / n).is_symlink() for n in ("timeline.png", "timeline.svg"))
