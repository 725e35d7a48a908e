"""The hang patterns (``diagnose.patterns.rules.decide``) on ranks already reduced to what they do:
which rule wins when several could, which ranks are named, the confidence and the sentence users
read. The activities are written by hand, so each test reads as the scene it describes."""

from __future__ import annotations

from areal_watchdog.diagnose.patterns.rules import decide
from areal_watchdog.diagnose.verdict import Activity, Verdict, culprit_entry
from areal_watchdog.evidence.model import (
    BLOCKED,
    EXITED,
    MISSING,
    RUNNING,
    Evidence,
    ExitInfo,
    RankEvidence,
)


def act(kind: str, op: str, line: int = 10) -> Activity:
    """A rank doing ``op`` (of ``kind``) reached from train.py:``line``."""
    where = f"{op} at train.py:{line} in step()"
    return Activity(kind, op, f"{op}@{line}", where)


def scene(
    acts: dict[int, Activity],
    states: dict[int, str] | None = None,
    **evidence: object,
) -> tuple[Evidence, dict[int, Activity]]:
    """Evidence of ``len(acts)`` ranks, two to a node, each blocked unless ``states`` says."""
    states = states or {}
    ranks = [
        RankEvidence(r, f"n{r // 2}", 100 + r, state=states.get(r, BLOCKED)) for r in sorted(acts)
    ]
    return Evidence(len(ranks), ranks, **evidence), acts  # type: ignore[arg-type]


def verdict_of(
    acts: dict[int, Activity], states: dict[int, str] | None = None, **evidence: object
) -> Verdict:
    return decide(*scene(acts, states, **evidence))


def test_a_lost_node_outranks_the_failures_it_caused() -> None:
    verdict = verdict_of(
        {
            0: act("collective", "all_reduce"),
            1: act("collective", "all_reduce"),
            2: act("exited", "exit"),
            3: act("exited", "exit"),
        },
        {2: EXITED, 3: EXITED},
        lost_nodes=["n1"],
        job_failed=True,
    )
    assert (verdict.category, verdict.culprit_ranks) == ("node_lost", [2, 3])
    assert verdict.summary.startswith("Node n1 (ranks 2-3) vanished")


def test_one_rank_in_cleanup_while_the_others_train_is_a_cleanup_deadlock() -> None:
    acts = {r: act("collective", "all_reduce") for r in range(3)}
    acts[2] = act("cleanup", "destroy_process_group", 40)
    verdict = verdict_of(acts)
    assert (verdict.category, verdict.culprit_ranks) == ("cleanup_deadlock", [2])
    assert verdict.summary.startswith(
        "Rank 2 already left the training loop and is in cleanup (destroy_process_group at "
    )
    assert "while ranks 0-1 still wait in all_reduce" in verdict.summary


def test_every_rank_in_cleanup_is_not_a_cleanup_deadlock() -> None:
    """Nobody left early when everyone is in cleanup: no rank may be blamed for it."""
    verdict = verdict_of({r: act("cleanup", "destroy_process_group") for r in range(2)})
    assert verdict.category != "cleanup_deadlock"
    assert verdict.culprit_ranks == []


def test_a_busy_outlier_is_a_straggler_and_a_sleeping_one_is_said_as_such() -> None:
    waiting = {r: act("collective", "all_reduce") for r in range(3)}
    busy = verdict_of({**waiting, 3: act("running", "compute", 50)}, {3: RUNNING})
    assert (busy.category, busy.culprit_ranks, busy.confidence) == ("straggler", [3], 0.8)
    assert busy.summary.startswith("Rank 3 is still in ordinary code (compute at train.py:50")
    assert "while ranks 0-2 wait in all_reduce: a straggler" in busy.summary

    asleep = verdict_of({**waiting, 3: act("blocked", "sleep", 50)})
    assert (asleep.category, asleep.culprit_ranks, asleep.confidence) == ("straggler", [3], 0.5)
    assert "blocked outside any collective, burning no CPU" in asleep.summary
    assert "ordinary code" not in asleep.summary


def test_many_late_ranks_lower_the_straggler_confidence() -> None:
    acts = {
        0: act("collective", "all_reduce"),
        1: act("running", "compute"),
        2: act("running", "compute"),
    }
    verdict = verdict_of(acts, {1: RUNNING, 2: RUNNING})
    assert (verdict.category, verdict.culprit_ranks, verdict.confidence) == (
        "straggler",
        [1, 2],
        0.55,
    )
    assert verdict.summary.startswith("Ranks 1-2 are still in ordinary code")
    assert "while rank 0 waits in all_reduce" in verdict.summary


def test_point_to_point_waits_name_the_minority_when_most_ranks_are_in_them() -> None:
    acts = {r: act("p2p", "recv", 20) for r in range(3)}
    acts[3] = act("p2p", "send", 30)
    verdict = verdict_of(acts)
    assert (verdict.category, verdict.culprit_ranks) == ("p2p_mismatch", [3])
    assert verdict.summary == (
        "Rank 3 waits in point-to-point send at train.py:30 in step() with no matching peer "
        "operation."
    )


def test_a_lone_outlier_among_four_is_a_confident_mismatch_among_three_less_so() -> None:
    four = {r: act("collective", "all_reduce", 81) for r in range(4)}
    four[2] = act("collective", "broadcast", 86)
    verdict = verdict_of(four)
    assert (verdict.category, verdict.culprit_ranks, verdict.confidence) == (
        "collective_mismatch",
        [2],
        0.9,
    )
    assert verdict.summary.startswith("Rank 2 is blocked in broadcast at train.py:86")
    assert "while ranks 0-1, 3 wait in all_reduce at train.py:81" in verdict.summary

    three = {r: act("collective", "all_reduce", 81) for r in range(3)}
    three[0] = act("collective", "broadcast", 86)
    assert verdict_of(three).confidence == 0.75


def test_a_stopped_rank_among_waiting_ones_is_the_frozen_peer() -> None:
    evidence, acts = scene({r: act("collective", "all_reduce") for r in range(3)})
    evidence.ranks[1].process_status = "stopped"
    verdict = decide(evidence, acts)
    assert (verdict.category, verdict.culprit_ranks) == ("collective_stuck", [1])
    assert verdict.summary.startswith("Rank 1 is stopped (SIGSTOP or a debugger)")


def test_before_the_first_step_ranks_that_never_arrived_are_named() -> None:
    acts = {
        0: act("init", "init_process_group"),
        1: act("init", "init_process_group"),
        2: act("unknown", "?"),
    }
    verdict = verdict_of(acts, {2: MISSING}, first_step_seen=False)
    assert (verdict.category, verdict.culprit_ranks, verdict.confidence) == (
        "init_deadlock",
        [2],
        0.85,
    )
    assert verdict.summary.startswith(
        "Before the first step, ranks 0-1 wait in init_process_group for their peers; rank 2 "
        "never arrived"
    )

    alone = verdict_of({0: act("init", "init_process_group")}, first_step_seen=False)
    assert (alone.category, alone.culprit_ranks, alone.confidence) == ("init_deadlock", [], 0.5)
    assert alone.summary == (
        "Before the first step, rank 0 waits in init_process_group for its peers; no rank can "
        "be named as late."
    )


def test_when_every_failure_is_a_lost_connection_the_first_is_named_with_its_peers() -> None:
    evidence, acts = scene(
        {0: act("exited", "exit"), 1: act("exited", "exit")}, {0: EXITED, 1: EXITED}
    )
    evidence.ranks[0].exit = ExitInfo(
        1,
        "exception",
        time=2.0,
        exc_type="DistBackendError",
        message="Connection reset by peer [10.0.0.2]:29500",
    )
    evidence.ranks[1].exit = ExitInfo(-15, "signal", time=1.0)
    verdict = decide(evidence, acts)
    assert (verdict.category, verdict.culprit_ranks, verdict.confidence) == (
        "rank_crashed",
        [1],
        0.5,
    )
    assert "every failure looks like a consequence of a lost peer" in verdict.summary
    assert verdict.summary.endswith("Peers report lost connections to 10.0.0.2:29500.")


def test_a_scene_no_rule_knows_is_unknown_and_names_the_unresponsive() -> None:
    verdict = verdict_of({0: act("rollout", "wait"), 1: act("rollout", "wait")})
    assert (verdict.category, verdict.culprit_ranks) == ("unknown", [])
    assert verdict.summary.startswith("The stacks fit no known hang pattern")


def test_a_culprit_that_is_no_rank_lists_only_what_is_known() -> None:
    server = RankEvidence(None, "n1", 77, role="inference_server", address="10.0.0.5:30000")
    assert culprit_entry(server) == {
        "role": "inference_server",
        "node": "n1",
        "pid": 77,
        "address": "10.0.0.5:30000",
    }
    assert culprit_entry(RankEvidence(3, "n0", 9))["role"] == "rank"


def test_a_controller_that_failed_calling_a_dead_server_names_the_server_beside_it() -> None:
    """AReaL's update_weights failed on a server that refuses connections: the controller's
    error is the story and the dead server is named beside it. A controller that failed on a
    bug of its own, whose teardown then stopped the servers, names no server."""
    server = {"address": "127.0.0.1:30000", "state": "unreachable", "node": "n0"}

    def failed(message: str) -> Verdict:
        controller = RankEvidence(None, "n0", 7, state=EXITED, role="controller")
        controller.exit = ExitInfo(1, "exception", 10.0, "EngineCallError", message)
        return decide(Evidence(1, [], servers=[server], workers=[controller]), {})

    verdict = failed("RuntimeError: /pause_generation answered 500")
    assert verdict.summary.startswith("The controller failed: raised EngineCallError")
    assert "The inference server 127.0.0.1:30000 refuses connections (dead?)." in verdict.summary
    assert [w["role"] for w in verdict.culprit_workers] == ["controller", "inference_server"]
    bug = failed("ValueError: batch size 2 is smaller than min_groups 8")
    assert "refuses" not in bug.summary and len(bug.culprit_workers) == 1
