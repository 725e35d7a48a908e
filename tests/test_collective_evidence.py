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
from recording import record_dumps, record_evidence

from areal_watchdog.diagnose.classify import classify
from areal_watchdog.evidence import offline
from areal_watchdog.evidence.listeners.flight_recorder import collect
from areal_watchdog.evidence.model import Evidence
from areal_watchdog.notify.sinks.slack.message import build_slack_message, check_limits
from areal_watchdog.rundir.layout import RunLayout
from conftest import REPO
from testkit.launcher import Launcher

SCENARIOS = REPO / "examples" / "collective_hangs" / "config.yaml"
DATA = Path(__file__).parent / "data" / "evidence"
FAST = ["experiment_name=hang-demo", "watchdog.stall_timeout=3", "watchdog.poll_interval=0.25"]


def run_scenario(
    launcher: Launcher, scenario: str, world: int, culprit: int, *extra: str
) -> tuple[dict, Path]:
    """Run one collective_hangs scenario to its report; each rank also dumps its Flight Recorder
    when it stalls, as NCCL's TORCH_NCCL_DUMP_ON_TIMEOUT would (pickle, JSON, onlyActive)."""
    dumps = launcher.root / "dumps"
    result = launcher.run(
        [
            *FAST,
            f"scenario.name={scenario}",
            f"scenario.rank={culprit}",
            f"launch.nproc_per_node={world}",
            f"+scenario.dump_dir={dumps}",
            *extra,
        ],
        config=SCENARIOS,
        trial=scenario,
    )
    assert len(result.reports) == 1, result.output[-3000:]
    return result.reports[0], dumps


def offline_verdicts(dumps: Path, formats: tuple[str, ...]) -> dict[str, tuple[str, list[int]]]:
    """What ``areal-launch diagnose`` concludes from each format of the dumps alone."""
    verdicts = {}
    for name in formats:
        verdict = classify(offline.load(dumps / name).evidence)
        verdicts[name] = (verdict.category, verdict.culprit_ranks)
    return verdicts


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
    """Each scenario's report names the rank. Where every rank waits at one sequence number
    (``mismatch``), the sensor between looks sees it long before a 60 s threshold."""
    sensed = scenario == "mismatch"
    extra = ["watchdog.stall_timeout=60"] if sensed else []
    report, dumps = run_scenario(launcher, scenario, world, culprit, *extra)
    if sensed:
        assert report["trigger"] == "collective_in_flight", report["trigger"]
        assert report["stalled_for_s"] < 15 and report["confirmation"]["by"] == "evidence"
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
    # The dumps alone (offline, as after a job that never ran under us) name the same rank.
    for name, (_, culprits) in offline_verdicts(dumps, ("pickle", "json", "active")).items():
        assert culprits == [culprit], name
    if scenario in ("mismatch", "extra_op"):
        record_dumps(dumps, f"{scenario}_w{world}_r{culprit}")


# scenario, world, injected rank, category, culprit ranks, evidence fixture name
ROUTING = [
    ("moe", 4, 3, "straggler", [3], "straggler_w4_r3--moe-uneven-all-to-all"),
    ("pairs", 4, 3, "straggler", [3], "straggler_w4_r3--pg-names-differ-from-pg-ids"),
    ("tie", 2, 1, "collective_mismatch", [0, 1], "collective_mismatch_w2_r0-1--two-rank-tie"),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scenario", "world", "injected", "category", "culprits", "fixture"),
    ROUTING,
    ids=[c[0] for c in ROUTING],
)
def test_legal_uneven_routing_multi_group_ids_and_a_tie(
    launcher: Launcher,
    scenario: str,
    world: int,
    injected: int,
    category: str,
    culprits: list[int],
    fixture: str,
) -> None:
    """moe: a legal uneven all_to_all_single every step, then rank 3 stalls in its own code;
    pairs: groups whose names and pg_ids differ on every rank, rank 3 stalls; tie: two ranks
    meet a fresh group with different collectives and no history to tell them apart."""
    report, dumps = run_scenario(launcher, scenario, world, injected)
    assert (report["category"], report["culprit_ranks"]) == (category, culprits), report["summary"]
    record = report["collectives"]
    assert record["culprit_ranks"] == culprits
    if scenario == "tie":
        assert "tie" in report["summary"]
        (tie,) = [g for g in record["groups"] if g["kind"] == "mismatch"]
        assert tie["tie"] and tie["culprit_ranks"] == [0, 1]
    else:  # uneven sizes are legal: no mismatch anywhere, and the record names the straggler
        assert all(g["kind"] != "mismatch" for g in record["groups"])
        assert f"rank {injected}" in report["summary"].lower()
    assert record["agreement"] == "the stacks and the collective record name the same ranks"
    offline_category = "straggler" if category == "straggler" else "collective_mismatch"
    for name, verdict in offline_verdicts(dumps, ("pickle", "json", "active")).items():
        assert verdict == (offline_category, culprits), name
    record_evidence(report, fixture)
    record_dumps(dumps, f"{scenario}_w{world}_r{injected}")


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
            "demo.hang=p2p_mismatch",
            "+watchdog.flight_recorder=false",  # no collective in flight to read: no sensor
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
    assert report["category"] == "p2p_mismatch" and report["culprit_ranks"] == [2]
    assert {r["gpu"]["state"] for r in report["ranks"]} == {"idle"}
    assert "every GPU idle or spinning" in result.output


def test_nccl_dump_pipe_is_used_when_no_listener_answers(tmp_path: Path) -> None:
    """ProcessGroupNCCL's own trigger, behind the same interface: a write on the rank's pipe
    makes it dump a pickle to the temp file; the sidecar reads it without running code."""
    layout = RunLayout(tmp_path)
    layout.flight_recorder_dir.mkdir(parents=True)
    os.mkfifo(layout.nccl_pipe(0))
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
        with open(layout.nccl_pipe(0)) as pipe:
            pipe.read()
        layout.nccl_dump(0).write_bytes(pickle.dumps(trace))

    thread = threading.Thread(target=fake_nccl)
    thread.start()
    time.sleep(0.3)  # like NCCL's watchdog thread, the reader sits in open() before any request
    traces = collect(layout, [0], timeout=5)
    thread.join(5)
    assert traces[0]["entries"][0]["profiling_name"] == "nccl:all_reduce"
    assert "frames" not in traces[0]["entries"][0]
    started = time.monotonic()  # no listener, no pipe (sshfs has no FIFOs): no trace, no wait
    assert collect(layout, [1], timeout=30) == {}
    assert time.monotonic() - started < 5


def entry(seq: int, op: str, group: str = "0", pg_id: int = 0, **kw: object) -> dict:
    """One Flight Recorder entry as PyTorch writes it (pickle form: tuples, ints)."""
    return {
        "collective_seq_id": seq,
        "profiling_name": f"nccl:{op}",
        "process_group": (group, "default_pg" if group == "0" else "undefined"),
        "pg_id": pg_id,
        "input_sizes": kw.get("inputs", [[4]]),
        "output_sizes": kw.get("outputs", [[4]]),
        "input_dtypes": ["Float"],
        "output_dtypes": ["Float"],
        "is_p2p": False,
        "retired": kw.get("retired", True),
        "state": "completed" if kw.get("retired", True) else "scheduled",
    }


def verdict_of(dumps: dict[int, dict]) -> tuple[str, list[int], str]:
    traces = {str(r): {"pg_config": {}, **d} for r, d in dumps.items()}
    verdict = classify(Evidence(world_size=len(dumps), ranks=[], flight_records=traces))
    return verdict.category, verdict.culprit_ranks, verdict.summary


def test_uneven_all_to_all_is_legal_but_totals_must_match() -> None:
    def a2a(rank: int, sent: int, received: int, retired: bool = True) -> dict:
        ops = [entry(1, "all_reduce"), entry(2, "all_to_all", inputs=[[sent, 8]])]
        ops[1]["output_sizes"] = [[received, 8]]
        ops[1]["retired"] = retired
        return {"entries": ops}

    legal = {0: a2a(0, 3, 5), 1: a2a(1, 5, 4), 2: a2a(2, 4, 3)}  # 12 sent, 12 received
    assert verdict_of(legal)[0] == "unknown"  # everything completed: no mismatch invented
    stuck = {r: {"entries": [entry(1, "all_reduce")]} for r in range(3)}
    stuck[0]["entries"].append(a2a(0, 3, 5, retired=False)["entries"][1])
    stuck[1]["entries"].append(a2a(1, 5, 4, retired=False)["entries"][1])
    assert verdict_of(stuck)[:2] == ("straggler", [2])  # rank 2 never joined the all_to_all
    broken = {0: a2a(0, 3, 5), 1: a2a(1, 5, 4), 2: a2a(2, 4, 9)}  # 12 sent, 18 expected
    category, culprits, summary = verdict_of(broken)
    assert (category, culprits) == ("collective_mismatch", []) and "cannot tell" in summary


def test_pg_status_is_read_under_each_ranks_own_pg_id() -> None:
    """Group "7" is pg_id 1 on rank 0 and pg_id 2 on rank 1 (NCCL pickles key pg_status by
    int pg_id; "7" is a decoy keyed by name). The ring buffer ends at #5 on both ranks, but
    rank 0 has enqueued #6 since: rank 1 is the one behind."""
    decoy = {"last_enqueued_collective": 99, "last_completed_collective": 99}

    def dump(pg_id: int, enqueued: int) -> dict:
        return {
            "entries": [entry(s, "all_reduce", "7", pg_id) for s in (4, 5)],
            "pg_status": {pg_id: {"last_enqueued_collective": enqueued}, "7": decoy},
        }

    category, culprits, summary = verdict_of({0: dump(1, 6), 1: dump(2, 5)})
    assert (category, culprits) == ("straggler", [1]) and "#6" in summary


def test_json_dumps_carry_status_numbers_as_strings() -> None:
    def dump(enqueued: str) -> dict:
        status = {"last_enqueued_collective": enqueued, "last_completed_collective": "3"}
        return {"entries": [entry(3, "barrier")], "pg_status": {"0": status}}

    assert verdict_of({0: dump("4"), 1: dump("4"), 2: dump("3")})[:2] == ("straggler", [2])


def test_a_two_rank_split_is_a_tie_without_history_and_decided_with_it() -> None:
    fresh = {0: {"entries": [entry(1, "all_reduce")]}, 1: {"entries": [entry(1, "broadcast")]}}
    category, culprits, summary = verdict_of(fresh)
    assert (category, culprits) == ("collective_mismatch", [0, 1]) and "tie" in summary

    def history(last: str) -> dict:  # all_reduce then barrier, three times; then the split
        ops = ["all_reduce", "barrier"] * 3 + ["all_reduce", last]
        return {"entries": [entry(s, op) for s, op in enumerate(ops, 1)]}

    category, culprits, summary = verdict_of({0: history("broadcast"), 1: history("barrier")})
    assert (category, culprits) == ("collective_mismatch", [0]) and "tie" not in summary


def test_a_trace_that_came_too_late_is_named_beside_the_agreement() -> None:
    """The stacks name rank 0 (spinning in the model while rank 1 waits in all_gather); when
    rank 0's trace did not arrive, the report says whose record is missing, not only that the
    record names no rank."""
    data = json.loads((DATA / "straggler_w2_r0--areal2-fsdp2-all-gather.json").read_text())
    whole = classify(Evidence.from_dict(data))
    assert whole.collectives["agreement"].startswith("the stacks and the collective record")
    del data["flight_records"]["0"]
    partial = classify(Evidence.from_dict(data))
    assert partial.culprit_ranks == [0]
    assert partial.collectives["agreement"] == (
        "the collective record names no rank (rank 0 sent no trace in time)"
    )
