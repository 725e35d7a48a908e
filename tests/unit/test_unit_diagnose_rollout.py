"""The rollout side's rules on recorded evidence of real rollout hangs, each changed in one
respect: which cause wins when several fit, where a threshold lies, what a lost weight update
names. What users see: the verdict's ``cause``, its culprit workers, its summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from areal_watchdog.diagnose.rollout_rules.rollout import REJECTIONS_FOR_FAILING, rollout_finding
from areal_watchdog.diagnose.rollout_rules.rollout_evidence import (
    RolloutFinding,
    first,
    links,
    names,
)
from areal_watchdog.diagnose.rollout_rules.weight_sync import in_weight_update
from areal_watchdog.evidence.model import Evidence, Frame, RankEvidence, ThreadStack

DATA = Path(__file__).resolve().parents[1] / "data"
SITE = "/venv/lib/python3.11/site-packages"


def recorded(name: str) -> Evidence:
    return Evidence.from_dict(json.loads((DATA / name).read_text()))


def finding(evidence: Evidence) -> RolloutFinding:
    found = rollout_finding(evidence)
    assert found is not None
    return found


def episode(server: str) -> dict[str, Any]:
    """A pending rollout task generating on ``server``, as a task dump lists it."""
    return {
        "name": "Task-7",
        "awaiting": server,
        "pending_s": 12.0,
        "chain": [
            {
                "name": "RLVRWorkflow.arun_episode",
                "filename": f"{SITE}/areal/workflow/rlvr.py",
                "line": 80,
            },
            {
                "name": "RemoteEngine.agenerate",
                "filename": f"{SITE}/areal/engine/remote.py",
                "line": 300,
            },
        ],
    }


def test_a_server_that_refuses_connections_outranks_what_the_logs_say() -> None:
    evidence = recorded("rollout/inference_paused.json")
    evidence.ranks[0].log_tail = "\n".join(["episode rejected"] * 5)
    assert finding(evidence).cause == "inference_paused"  # server evidence first
    evidence.servers[0]["state"] = "unreachable"
    found = finding(evidence)
    assert (found.category, found.cause, found.culprit_ranks) == (
        "rollout_stalled",
        "inference_unreachable",
        [],
    )
    assert found.summary.endswith(
        ": the inference server 127.0.0.1:30817 refuses connections (dead?)."
    )
    assert [w["address"] for w in found.culprit_workers] == ["127.0.0.1:30817"]


def test_two_dead_servers_are_both_named_in_the_plural() -> None:
    evidence = recorded("rollout/inference_unreachable.json")
    evidence.servers.append({**evidence.servers[0], "address": "127.0.0.1:30818"})
    found = finding(evidence)
    assert "the inference servers 127.0.0.1:30817, 127.0.0.1:30818 refuse connections" in (
        found.summary
    )
    assert len(found.culprit_workers) == 2


@pytest.mark.parametrize("rejections", [REJECTIONS_FOR_FAILING - 1, REJECTIONS_FOR_FAILING])
def test_episodes_fail_only_when_a_log_tail_rejects_enough_of_them(rejections: int) -> None:
    evidence = recorded("rollout/staleness_blocked.json")
    evidence.ranks[1].log_tail = "\n".join(["[workflow] episode rejected: bad answer"] * rejections)
    found = finding(evidence)
    if rejections < REJECTIONS_FOR_FAILING:
        assert found.cause == "staleness_blocked"
    else:
        assert (found.cause, found.confidence) == ("workflow_failing", 0.75)
        assert f"({rejections} rejections in one log tail)" in found.summary


def test_every_episode_failing_quotes_the_exception_it_repeats() -> None:
    """The recorded run of examples/rollout_hangs (every episode raises from step 6): the
    finding names the exception; AReaL's own traceback form is read the same way."""
    found = finding(recorded("rollout/workflow_failing.json"))
    assert found.cause == "workflow_failing"
    assert "the same exception each time (" in found.summary
    assert "`ValueError: reward function: cannot parse the answer (None)`" in found.summary
    evidence = recorded("rollout/staleness_blocked.json")
    areal = (
        "WorkflowExecutor ERROR: Workflow execution failed: 'answer'\nTraceback (most "
        "recent call last):\n  File \"w.py\", line 9, in arun_episode\nKeyError: 'answer'\n"
    )
    evidence.ranks[1].log_tail = areal * 4
    found = finding(evidence)
    assert found.summary.endswith("the same exception each time (4 times): `KeyError: 'answer'`.")


def test_a_capacity_wait_with_a_rollout_in_flight_is_not_blocked_by_staleness() -> None:
    evidence = recorded("rollout/staleness_blocked.json")
    assert finding(evidence).cause == "staleness_blocked"
    evidence.ranks[0].tasks = [episode("127.0.0.1:30817")]
    found = finding(evidence)
    assert (found.cause, found.confidence) == ("unknown", 0.4)
    assert found.summary.endswith("the inference servers look healthy; read the task dumps.")


def test_an_idle_vllm_engine_the_job_awaits_is_held_at_areals_pause_gate() -> None:
    evidence = recorded("rollout/staleness_blocked.json")
    evidence.servers[0]["engine"] = "vllm"
    evidence.ranks[0].tasks = [episode("127.0.0.1:30817")]
    found = finding(evidence)
    assert (found.cause, found.confidence) == ("inference_paused", 0.7)
    assert "AReaL's vLLM pause gate" in found.summary


def test_a_collective_hang_is_not_the_rollout_sides() -> None:
    assert rollout_finding(recorded("evidence/collective_mismatch_w4_r2.json")) is None


def test_a_transfer_the_busy_servers_never_entered_is_less_certain() -> None:
    evidence = recorded("evidence/weight_sync_stuck_w2_r0.json")
    evidence.servers[0]["running"] = 3.0  # busy generating: not idle
    found = finding(evidence)
    assert (found.category, found.culprit_ranks, found.confidence) == (
        "weight_sync_stuck",
        [0],
        0.7,
    )
    assert "and the inference side is not transferring; rank 1 waits for it." in found.summary
    assert found.culprit_workers == []


LOST = "evidence/weight_sync_stuck_w1_r--areal-lost-disk-update.json"
HELD = "127.0.0.1:15681"


def test_a_lost_update_seen_from_both_sides_names_the_server_and_its_waiter() -> None:
    found = finding(recorded(LOST))
    assert (found.category, found.culprit_ranks, found.confidence) == ("weight_sync_stuck", [], 0.9)
    assert [(w["role"], w.get("address"), w.get("index")) for w in found.culprit_workers] == [
        ("inference_server", HELD, None),
        ("rollout", None, 1),
    ]
    assert found.summary.endswith("No update request is pending on 127.0.0.1:32735.")


def test_a_lost_update_seen_from_the_server_side_only_names_the_server() -> None:
    evidence = recorded(LOST)
    waiter = next(w for w in evidence.workers if w.role == "rollout" and w.worker_index == 1)
    waiter.tasks = [t for t in waiter.tasks if t.get("awaiting") != HELD]
    found = finding(evidence)
    assert found.confidence == 0.85
    assert [w["role"] for w in found.culprit_workers] == ["inference_server"]
    assert "the server's request thread is still in its update handler" in found.summary


def test_a_lost_update_seen_from_the_waiter_only_still_names_the_server() -> None:
    evidence = recorded(LOST)
    server = next(w for w in evidence.workers if w.address == HELD)
    server.threads = [t for t in server.threads if not any(in_weight_update(f) for f in t.frames)]
    found = finding(evidence)
    assert found.confidence == 0.85
    assert found.summary.startswith(
        f"A weight update never completed on the inference server {HELD} (pid 7817): "
        "rollout 1 (pid 7635, node vm) waits"
    )
    assert "request thread" not in found.summary


def test_only_areals_update_weights_is_a_weight_transfer() -> None:
    assert in_weight_update(Frame("FSDPEngine.update_weights", f"{SITE}/areal/engine/fsdp.py", 1))
    assert not in_weight_update(Frame("Trainer.update_weights", "/home/me/train.py", 1))
    assert in_weight_update(Frame("Handler.update_weights_from_disk", "/home/me/server.py", 1))
    assert in_weight_update(Frame("areal_update_weights_xccl", f"{SITE}/areal/vllm.py", 1))


def test_processes_are_named_ranks_first_then_each_part_by_pid() -> None:
    processes = [
        RankEvidence(3, "n0", 13),
        RankEvidence(0, "n0", 10),
        RankEvidence(1, "n0", 11),
        RankEvidence(None, "n1", 12, role="controller"),
        RankEvidence(None, "", 14, role="rollout", worker_index=0),
    ]
    assert names(processes) == "ranks 0-1, 3, the controller (pid 12, node n1), rollout 0 (pid 14)"


def test_the_outermost_matching_frame_of_the_main_thread_comes_first() -> None:
    def thread(name: str, *calls: str) -> ThreadStack:
        return ThreadStack(name, [Frame(c, "/w/t.py", i) for i, c in enumerate(calls)])

    worker = thread("Worker", "wait_results", "loop")
    main = thread("MainThread", "wait_results", "prepare_batch", "step", "<module>")
    process = RankEvidence(0, threads=[worker, main])
    found = first(process, lambda f: f.name in ("wait_results", "prepare_batch"))
    assert found is main.frames[1]
    assert first(process, lambda f: f.name == "loop") is worker.frames[1]
    assert first(process, lambda f: f.name == "absent") is None
    assert links(episode("x")) == {"arun_episode", "agenerate"}
