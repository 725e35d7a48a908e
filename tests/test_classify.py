"""The classifier on recorded evidence from real hangs and on synthetic inputs, large ones too."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from areal_watchdog.diagnose.classify import classify, ended_cleanly
from areal_watchdog.evidence.model import (
    BLOCKED,
    EXITED,
    MISSING,
    RUNNING,
    Evidence,
    ExitInfo,
    Frame,
    RankEvidence,
    ThreadStack,
)

RECORDED = sorted((Path(__file__).parent / "data" / "evidence").glob("*.json"))
TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
USER = "/home/me/project/train.py"


def stack(*frames: tuple[str, str, int]) -> list[ThreadStack]:
    """A main thread from (name, file, line) frames, innermost first."""
    return [ThreadStack("MainThread", [Frame(n, f, line) for n, f, line in frames])]


def in_collective(op: str, line: int, caller: str = "step") -> list[ThreadStack]:
    return stack(
        (op, TORCH, 100), (caller, USER, line), ("main", USER, 200), ("<module>", USER, 300)
    )


def rank(r: int, threads: list[ThreadStack], state: str = BLOCKED, **kw: object) -> RankEvidence:
    return RankEvidence(
        rank=r,
        node=f"node{r // 8}",
        pid=1000 + r,
        state=state,
        evidence_method="py-spy",
        threads=threads,
        **kw,
    )


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_recorded_evidence_from_real_hangs(path: Path) -> None:
    # File names carry the expected verdict: <category>_w<world>_r<culprits>[--<label>].json
    category, _, culprits = path.stem.split("--")[0].rpartition("_r")
    category = category.rsplit("_w", 1)[0]
    verdict = classify(Evidence.from_dict(json.loads(path.read_text())))
    assert verdict.category == category
    assert verdict.culprit_ranks == [int(c) for c in culprits.split("-") if c]


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("cleanup_deadlock_w2_r0--areal-early-exit", "while rank 1 still waits in "),
        ("cleanup_deadlock_w3_r0", "while ranks 1-2 still wait in "),
        ("init_deadlock_w3_r1", "ranks 0, 2 wait in init_process_group for their peers"),
        (
            "unknown_w4_r--every-rank-in-its-own-code",  # every rank spins in the same function
            "Ranks 0-3 are in the job's own code (at examples/hang_demo/train.py:152 in "
            "busy_reward_model() <- Trainer.step()",
        ),
    ],
)
def test_a_summary_agrees_with_one_rank_and_with_many(name: str, said: str) -> None:
    data = json.loads((RECORDED[0].parent / f"{name}.json").read_text())
    assert said in classify(Evidence.from_dict(data)).summary


ONE_RANK_PLURAL = re.compile(r"\brank \d+ (?:still )?(?:wait|are|were)\b")
MANY_RANKS_SINGULAR = re.compile(r"\branks [\d, -]+ (?:still )?(?:waits|is|was)\b")


def test_no_recorded_summary_mixes_up_one_rank_and_many() -> None:
    rollout = sorted((RECORDED[0].parent.parent / "rollout").glob("*.json"))
    for path in [*RECORDED, *rollout]:
        summary = classify(Evidence.from_dict(json.loads(path.read_text()))).summary
        assert not ONE_RANK_PLURAL.search(summary), (path.stem, summary)
        assert not MANY_RANKS_SINGULAR.search(summary), (path.stem, summary)
        assert "(s)" not in summary, (path.stem, summary)


def test_recorded_evidence_covers_every_pattern() -> None:
    categories = {p.stem.split("--")[0].rsplit("_w", 1)[0] for p in RECORDED}
    assert {
        "collective_mismatch",
        "collective_stuck",
        "cleanup_deadlock",
        "straggler",
        "dataloader_stall",
        "init_deadlock",
        "p2p_mismatch",
        "rank_crashed",
    } <= categories


@pytest.mark.parametrize(
    "frozen_at",
    [in_collective("all_gather_into_tensor", 90), stack(("forward", USER, 40), ("main", USER, 9))],
    ids=["in-another-collective", "in-ordinary-code"],
)
def test_a_stopped_rank_is_the_frozen_peer_wherever_its_stack_stopped(
    frozen_at: list[ThreadStack],
) -> None:
    """SIGSTOP freezes a rank wherever it is: in ordinary code (not a straggler: it burns no
    CPU and never will) or in a collective its peers are not in (not a code-path mismatch)."""
    evidence = Evidence(
        world_size=3,
        ranks=[
            rank(0, in_collective("all_reduce", 81)),
            rank(1, frozen_at, process_status="stopped"),
            rank(2, in_collective("all_reduce", 81)),
        ],
    )
    verdict = classify(evidence)
    assert (verdict.category, verdict.culprit_ranks) == ("collective_stuck", [1])
    assert verdict.summary.startswith("Rank 1 is stopped (SIGSTOP or a debugger) while ranks 0, 2")


def test_ten_thousand_ranks_one_outlier() -> None:
    ranks = [rank(r, in_collective("all_reduce", 120)) for r in range(10_000)]
    ranks[4321] = rank(4321, in_collective("broadcast", 130, caller="log_metrics"))
    verdict = classify(Evidence(world_size=10_000, ranks=ranks))
    assert verdict.category == "collective_mismatch"
    assert verdict.culprit_ranks == [4321]
    assert verdict.culprit_nodes == ["node540"]
    assert [len(g.ranks) for g in verdict.groups] == [9_999, 1]
    assert "ranks 0-4320, 4322-9999" in verdict.summary


def test_same_collective_at_another_call_site_is_a_mismatch() -> None:
    ranks = [rank(r, in_collective("all_reduce", 120)) for r in range(8)]
    ranks[5] = rank(5, in_collective("all_reduce", 140))
    verdict = classify(Evidence(world_size=8, ranks=ranks))
    assert (verdict.category, verdict.culprit_ranks) == ("collective_mismatch", [5])


def test_everyone_in_one_collective_is_stuck_with_no_culprit() -> None:
    ranks = [rank(r, in_collective("all_reduce", 120)) for r in range(4)]
    verdict = classify(Evidence(world_size=4, ranks=ranks))
    assert (verdict.category, verdict.culprit_ranks) == ("collective_stuck", [])
    assert "network" in verdict.summary


def test_two_ranks_split_evenly_names_both_with_low_confidence() -> None:
    ranks = [rank(0, in_collective("all_reduce", 120)), rank(1, in_collective("barrier", 150))]
    verdict = classify(Evidence(world_size=2, ranks=ranks))
    assert verdict.category == "collective_mismatch"
    assert verdict.culprit_ranks == [0, 1] and verdict.confidence < 0.5


def test_cleanup_with_qualified_method_names() -> None:
    cleanup = stack(
        ("barrier", TORCH, 10),
        ("Engine.close", USER, 50),
        ("Engine.__exit__", USER, 60),
        ("main", USER, 200),
    )
    ranks = [rank(r, in_collective("all_reduce", 120)) for r in range(4)] + [rank(4, cleanup)]
    verdict = classify(Evidence(world_size=5, ranks=ranks))
    assert (verdict.category, verdict.culprit_ranks) == ("cleanup_deadlock", [4])


def test_straggler_needs_moving_cpu_or_ordinary_code() -> None:
    busy = stack(("compute_reward", USER, 77), ("step", USER, 90), ("main", USER, 200))
    ranks = [rank(r, in_collective("all_reduce", 120)) for r in range(3)]
    ranks.append(rank(3, busy, state=RUNNING, cpu_utilization=0.98))
    verdict = classify(Evidence(world_size=4, ranks=ranks))
    assert (verdict.category, verdict.culprit_ranks) == ("straggler", [3])
    assert "compute_reward" in verdict.summary


def test_ddp_backward_counts_as_collective_only_without_cpu() -> None:
    backward = stack(
        ("_engine_run_backward", "/v/site-packages/torch/autograd/graph.py", 5),
        ("backward", "/v/site-packages/torch/_tensor.py", 9),
        ("step", USER, 80),
        ("main", USER, 200),
    )
    waiting = [rank(r, backward, cpu_utilization=0.0) for r in range(3)]
    other = rank(3, in_collective("all_reduce", 120), cpu_utilization=0.0)
    verdict = classify(Evidence(world_size=4, ranks=[*waiting, other]))
    assert (verdict.category, verdict.culprit_ranks) == ("collective_mismatch", [3])
    computing = [rank(r, backward, state=RUNNING, cpu_utilization=1.0) for r in range(3)]
    verdict = classify(Evidence(world_size=4, ranks=[*computing, other]))
    assert verdict.category == "straggler" and verdict.culprit_ranks == [0, 1, 2]


def test_init_deadlock_names_missing_ranks() -> None:
    init = stack(("init_process_group", TORCH, 1), ("main", USER, 10))
    ranks = [rank(r, init) for r in range(3)] + [RankEvidence(rank=3, state=MISSING)]
    verdict = classify(Evidence(world_size=4, ranks=ranks, first_step_seen=False))
    assert (verdict.category, verdict.culprit_ranks) == ("init_deadlock", [3])


def test_crash_blames_first_real_failure_not_connection_errors() -> None:
    def exited(r: int, t: float, exc: str, msg: str) -> RankEvidence:
        return rank(
            r,
            [],
            state=EXITED,
            exit=ExitInfo(code=1, kind="exception", time=t, exc_type=exc, message=msg),
        )

    ranks = [
        exited(0, 10.0, "RuntimeError", "Connection closed by peer [127.0.0.1]:4242"),
        exited(1, 10.1, "RuntimeError", "Connection closed by peer [127.0.0.1]:4243"),
        exited(2, 10.5, "ValueError", "shape mismatch"),  # later, but the only real error
        rank(3, [], state=EXITED, exit=ExitInfo(code=-15, kind="signal")),
    ]
    verdict = classify(Evidence(world_size=4, ranks=ranks, job_failed=True))
    assert (verdict.category, verdict.culprit_ranks) == ("rank_crashed", [2])
    assert "shape mismatch" in verdict.summary and "127.0.0.1:4242" in verdict.summary


def test_quiet_exit_zero_among_failures_is_the_culprit() -> None:
    ranks = [
        rank(
            0,
            [],
            state=EXITED,
            exit=ExitInfo(
                code=1,
                kind="exception",
                time=5.0,
                exc_type="RuntimeError",
                message="Connection reset by peer",
            ),
        ),
        rank(1, [], state=EXITED, exit=ExitInfo(code=0, kind="returned", time=4.0)),
    ]
    verdict = classify(Evidence(world_size=2, ranks=ranks, job_failed=True))
    assert (verdict.category, verdict.culprit_ranks) == ("rank_crashed", [1])


def test_a_failed_job_whose_ranks_all_returned_says_so() -> None:
    """CI's saturated-vLLM run: every rank returned with code 0 by the time its evidence was
    read; the report must not say no rank left an exit record."""
    ended = ExitInfo(code=0, kind="returned", time=4.0)
    ranks = [rank(r, [], state=EXITED, exit=ended) for r in range(2)]
    verdict = classify(Evidence(world_size=2, ranks=ranks, job_failed=True))
    said = "Ranks 0-1 returned with code 0 and no rank failed; see the log tails."
    assert verdict.summary == said


def test_no_stacks_at_all_is_unknown_but_explained() -> None:
    ranks = [
        RankEvidence(rank=r, state="unresponsive", error="py-spy: Permission denied")
        for r in range(2)
    ]
    verdict = classify(Evidence(world_size=2, ranks=ranks))
    assert verdict.category == "unknown" and verdict.summary


def test_evidence_round_trips_every_thread_and_the_rollout_fields() -> None:
    threads = [
        ThreadStack("MainThread", [Frame("serve_forever", "/l/socketserver.py", 1)], False, False),
        ThreadStack("EngineWorker", [Frame("all_reduce", TORCH, 2)], True, True, 140001),
    ]
    task = {"name": "Task-3", "chain": [{"name": "agenerate", "file": "/a.py", "line": 9}]}
    evidence = Evidence(
        world_size=1,
        ranks=[rank(0, threads, role="actor", worker_index=3, tasks=[task])],
        servers=[{"address": "127.0.0.1:30000", "state": "up"}],
    )
    again = Evidence.from_dict(json.loads(json.dumps(evidence.to_dict())))
    assert again == evidence
    old = json.loads((RECORDED[0].parent / "cleanup_deadlock_w3_r0.json").read_text())
    assert all("active" not in t for r in old["ranks"] for t in r.get("threads", []))
    loaded = Evidence.from_dict(old)
    assert loaded.ranks[0].role is None and loaded.ranks[0].threads[0].active is None
    assert loaded.servers == []


def test_ten_thousand_ranks_with_every_thread_and_task_lists() -> None:
    def worker_rank(r: int, op: str, line: int) -> RankEvidence:
        serving = ThreadStack("MainThread", [Frame("serve_forever", "/l/socketserver.py", 1)])
        idle = ThreadStack("Thread-2", [Frame("wait", "/l/threading.py", 3)], active=False)
        engine = ThreadStack(
            "EngineWorker", [Frame(op, TORCH, 100), Frame("train", USER, line)], active=False
        )
        tasks = [{"name": f"Task-{i}", "chain": [{"name": "agenerate"}]} for i in range(3)]
        return rank(r, [serving, idle, engine], tasks=tasks)

    ranks = [worker_rank(r, "all_reduce", 120) for r in range(10_000)]
    ranks[777] = worker_rank(777, "broadcast", 130)
    verdict = classify(Evidence(world_size=10_000, ranks=ranks))
    assert (verdict.category, verdict.culprit_ranks) == ("collective_mismatch", [777])
    assert "thread EngineWorker" in verdict.summary


def test_a_job_whose_every_rank_ended_cleanly_is_finishing_not_hung() -> None:
    """The stall threshold can pass while the ranks tear down: all exited 0 is no hang, but
    one process still alive (or one exit code that is not 0) keeps it a hang to report."""
    done = [RankEvidence(r, state=EXITED, exit=ExitInfo(code=0, kind="returned")) for r in range(2)]
    assert ended_cleanly(Evidence(world_size=2, ranks=done))
    failed = [*done[:1], RankEvidence(1, state=EXITED, exit=ExitInfo(code=1, kind="exit"))]
    assert not ended_cleanly(Evidence(world_size=2, ranks=failed))
    controller = RankEvidence(None, role="controller", state=BLOCKED)
    assert not ended_cleanly(Evidence(world_size=2, ranks=done, workers=[controller]))


SITE = "/venv/lib/python3.11/site-packages"
SCRIPT = "/home/me/proj/gsm8k_rl.py"


def test_an_early_exit_from_areals_loop_is_a_cleanup_deadlock_of_the_rank_that_left() -> None:
    """AReaL #684's shape: rank 0 left train() and waits in dist.barrier inside
    FSDPEngine.destroy (PPOTrainer.__exit__ -> close); rank 1 went on into the weight update
    and waits, idle, in a functional collective (DTensor.redistribute -> wait_tensor)."""
    left = stack(
        ("barrier", TORCH, 4800),
        ("FSDPEngine.destroy", f"{SITE}/areal/engine/fsdp_engine.py", 310),
        ("PPOTrainer.close", f"{SITE}/areal/trainer/rl_trainer.py", 700),
        ("PPOTrainer.__exit__", f"{SITE}/areal/trainer/rl_trainer.py", 720),
        ("main", SCRIPT, 47),
        ("<module>", SCRIPT, 56),
    )
    went_on = stack(
        ("__call__", f"{SITE}/torch/_ops.py", 1100),
        ("wait_tensor", f"{SITE}/torch/distributed/_functional_collectives.py", 140),
        ("redistribute", f"{SITE}/torch/distributed/tensor/_redistribute.py", 200),
        ("DTensor.full_tensor", f"{SITE}/torch/distributed/tensor/_api.py", 560),
        ("FSDPEngine.update_weights", f"{SITE}/areal/engine/fsdp_engine.py", 900),
        ("PPOTrainer.train", f"{SITE}/areal/trainer/rl_trainer.py", 400),
        ("main", SCRIPT, 40),
        ("<module>", SCRIPT, 56),
    )
    ranks = [rank(0, left, cpu_utilization=0.0), rank(1, went_on, cpu_utilization=0.01)]
    verdict = classify(Evidence(world_size=2, ranks=ranks))
    assert (verdict.category, verdict.culprit_ranks) == ("cleanup_deadlock", [0])
    assert "FSDPEngine.destroy" in verdict.summary and "wait_tensor" in verdict.summary


def test_a_rank_that_burns_no_cpu_is_never_still_in_ordinary_code() -> None:
    sleeping = stack(("sleep", USER, 9), ("step", USER, 90), ("main", USER, 200))
    ranks = [rank(r, in_collective("all_reduce", 120)) for r in range(3)]
    ranks.append(rank(3, sleeping, cpu_utilization=0.0))
    verdict = classify(Evidence(world_size=4, ranks=ranks))
    assert (verdict.category, verdict.culprit_ranks) == ("straggler", [3])
    assert "still in ordinary code" not in verdict.summary
    assert "blocked outside any collective, burning no CPU" in verdict.summary


def test_a_controller_exception_is_the_summary_not_the_workers_it_ended() -> None:
    """AReaL's single controller raised EngineCallError from ppo_update; its teardown ended
    the actor workers (ranks 0-3) after it."""
    message = (
        "EngineCallError: Engine method 'ppo_update' failed on worker actor/0: ValueError: "
        "Number of values 1 is smaller than min_groups 4"
    )
    controller = RankEvidence(
        None, node="n", pid=77, role="controller", state=EXITED,
        exit=ExitInfo(code=1, kind="exception", time=10.0, exc_type="EngineCallError",
                      message=message,
                      traceback=f'File "{SCRIPT}", line 47, in main\nEngineCallError: ...'),
    )  # fmt: skip
    ended = [
        RankEvidence(r, node="n", pid=100 + r, role="actor", worker_index=r, state=EXITED,
                     exit=ExitInfo(time=11.0))
        for r in range(4)
    ]  # fmt: skip
    verdict = classify(Evidence(world_size=4, ranks=ended, workers=[controller], job_failed=True))
    assert verdict.category == "rank_crashed" and verdict.culprit_ranks == []
    assert verdict.culprit_workers == [{"role": "controller", "node": "n", "pid": 77}]
    assert verdict.summary.startswith("The controller failed: raised EngineCallError")
    assert "Number of values 1 is smaller than min_groups 4" in verdict.summary
    assert "ranks 0-3 ended after it" in verdict.summary


def test_paths_in_summaries_cannot_be_mistaken_for_areals() -> None:
    """A user's own ``areal/`` folder beside AReaL's installed package: the user's file is
    shown relative to the rank's working directory, AReaL's under site-packages/."""
    mine = "/home/me/proj/src/areal/my_workflow.py"
    stuck = stack(("compute", mine, 12), ("step", mine, 30), ("main", SCRIPT, 40))
    ranks = [rank(r, in_collective("all_reduce", 120)) for r in range(2)]
    ranks.append(rank(2, stuck, state=RUNNING, cpu_utilization=1.0, cwd="/home/me/proj"))
    verdict = classify(Evidence(world_size=3, ranks=ranks))
    assert "at src/areal/my_workflow.py:12 in compute()" in verdict.summary
    elsewhere = rank(2, stuck, state=RUNNING, cpu_utilization=1.0, cwd="/srv")
    verdict = classify(Evidence(world_size=3, ranks=[*ranks[:2], elsewhere]))
    assert f"at {mine}:12" in verdict.summary
