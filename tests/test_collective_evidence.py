"""Evidence beyond stacks on real jobs: Flight Recorder traces from real gloo hangs, idle GPUs
from recorded NVML samples. Each test asserts the ranks a user reads in report.json."""

from __future__ import annotations

import json
import os
import pickle
import threading
import time
from pathlib import Path

import pytest

from areal_watchdog.evidence.flight_recorder import collect, nccl_dump, nccl_pipe
from areal_watchdog.notify.slack import build_slack_message, check_limits
from areal_watchdog.rundir.layout import RunLayout
from conftest import REPO, Launcher

SCENARIOS = REPO / "examples" / "collective_hangs" / "config.yaml"
FAST = ["experiment_name=hang-demo", "watchdog.stall_timeout=3", "watchdog.poll_interval=0.25"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scenario", "world", "culprit", "kind", "stacks_agree"),
    [
        ("mismatch", 4, 2, "mismatch", True),  # different ops at the same sequence id
        ("missing", 3, 1, "missing", True),  # one rank never issues the next collective
        ("subgroup", 4, 1, "mismatch", False),  # the divergence lives in a subgroup
        ("extra_op", 2, 1, "mismatch", False),  # two ranks, an extra op of another type
    ],
)
def test_flight_recorder_names_the_rank_that_diverged(
    launcher: Launcher, scenario: str, world: int, culprit: int, kind: str, stacks_agree: bool
) -> None:
    result = launcher.run(
        [
            *FAST,
            f"scenario.name={scenario}",
            f"scenario.rank={culprit}",
            f"launch.nproc_per_node={world}",
        ],
        config=SCENARIOS,
        trial=scenario,
    )
    (report,) = result.reports
    assert report["culprit_ranks"] == [culprit], report["summary"]
    collectives = report["collectives"]
    assert collectives["ranks_without_trace"] == []
    assert collectives["culprit_ranks"] == [culprit]
    decisive = [g for g in collectives["groups"] if g["kind"] == kind]
    assert decisive and culprit in decisive[0]["culprit_ranks"]
    assert any(f"rank {culprit} at #" in row for g in collectives["groups"] for row in g["table"])
    same = collectives["agreement"] == "the stacks and the collective record name the same ranks"
    assert same == stacks_agree, collectives["agreement"]
    if not stacks_agree:
        assert "The collective record shows" in report["summary"]
    assert report["timings"]["flight_recorder_s"] < 2
    md = (Path(report["files"]["incident_dir"]) / "report.md").read_text()
    assert "## Collectives (Flight Recorder)" in md
    slack = build_slack_message(report)
    assert check_limits(slack) == [] and "Collective record" in json.dumps(slack)


@pytest.mark.slow
def test_without_flight_recorder_the_verdict_rests_on_stacks(launcher: Launcher) -> None:
    result = launcher.run(
        [
            *FAST,
            "scenario.name=extra_op",
            "scenario.rank=1",
            "launch.nproc_per_node=2",
            "+watchdog.flight_recorder=false",
        ],
        config=SCENARIOS,
        trial="nofr",
    )
    (report,) = result.reports
    assert report["collectives"] is None
    assert report["culprit_ranks"] == [0, 1]  # two ranks, stacks only: both named, low confidence
    assert report["confidence"] < 0.5


@pytest.mark.slow
def test_idle_gpus_trigger_evidence_before_the_stall_timeout(launcher: Launcher) -> None:
    recording = REPO / "tests" / "data" / "gpu" / "idle.jsonl"
    result = launcher.run(
        [
            "watchdog.stall_timeout=120",
            "watchdog.poll_interval=0.25",
            "watchdog.on_hang=cancel",
            "launch.nproc_per_node=3",
            "demo.hang=collective_mismatch",
            "demo.hang_rank=2",
            "demo.hang_step=2",
            "demo.step_time=0.1",
            f"+watchdog.gpu={{backend: recorded, recording: {recording}, idle_timeout: 3}}",
        ]
    )
    assert result.returncode == 3, result.output[-2000:]
    (report,) = result.reports
    assert report["trigger"] == "gpu_idle"
    assert report["stalled_for_s"] < 120
    assert report["category"] == "collective_mismatch" and report["culprit_ranks"] == [2]
    assert {r["gpu"]["state"] for r in report["ranks"]} == {"idle"}
    assert "every GPU idle or spinning" in result.output


def test_nccl_dump_pipe_is_used_when_no_listener_answers(tmp_path: Path) -> None:
    """ProcessGroupNCCL's own trigger, behind the same interface: a write on the rank's pipe
    makes it dump a pickle to the temp file; the sidecar reads it without running code."""
    layout = RunLayout(tmp_path)
    layout.flight_recorder_dir.mkdir(parents=True)
    os.mkfifo(nccl_pipe(layout, 0))
    trace = {
        "pg_status": {"0": {"last_completed_collective": 6}},
        "entries": [
            {
                "collective_seq_id": 7,
                "profiling_name": "nccl:all_reduce",
                "process_group": ["0", "default_pg"],
                "frames": ["dropped"],
            }
        ],
    }

    def fake_nccl() -> None:
        with open(nccl_pipe(layout, 0)) as pipe:
            pipe.read()
        nccl_dump(layout, 0).write_bytes(pickle.dumps(trace))

    thread = threading.Thread(target=fake_nccl)
    thread.start()
    time.sleep(0.3)  # like NCCL's watchdog thread, the reader sits in open() before any request
    traces = collect(layout, [0], timeout=5)
    thread.join(5)
    assert traces[0]["entries"][0]["profiling_name"] == "nccl:all_reduce"
    assert "frames" not in traces[0]["entries"][0]
    assert collect(layout, [1], timeout=0.2) == {}  # no listener, no pipe: no trace, no wait
