"""The leader's decisions, without processes: each trigger fires once, in order, and an ending
on purpose (a cancel, a user's Ctrl-C) is never taken for a failure."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

from areal_watchdog.diagnose.movement import Marks, marks, moved
from areal_watchdog.evidence.model import Evidence, Frame
from areal_watchdog.evidence.trigger import Trigger
from areal_watchdog.watch.silence.triggers import Reported, Say, Snapshot, decide, progressed

HEALTHY = Snapshot(
    now=100.0,
    first_step_seen=True,
    silent_for=1.0,
    threshold=10.0,
    stalled=False,
    alive=frozenset({0, 1, 2, 3}),
    others_alive=0,
    gone=frozenset(),
    gone_clean=False,
    gone_since=None,
    crash_grace=5.0,
    gpus_quiet_for=0.0,
    gpu_idle_timeout=30.0,
    in_flight_over=float("-inf"),
    in_flight_op="",
    silent_nodes=(),
    servers_refusing=(),
    server_awaited="",
    in_kernel_for=0.0,
    ended_nodes=0,
    n_nodes=2,
    silent_job_nodes=0,
    failed=False,
    ending_on_purpose=False,
)


NOTHING_YET = Reported()


def triggers(snap: Snapshot, reported: Reported = NOTHING_YET) -> list:
    actions, _ = decide(snap, reported)
    return [a.trigger or a.say for a in actions]


def test_a_healthy_job_triggers_nothing() -> None:
    assert triggers(HEALTHY) == []


def test_a_server_that_refuses_connections_opens_a_look_at_once_whatever_the_threshold() -> None:
    """One second into the silence, warm-up or not: a refused connection is a fact. Once a
    silence, after a failure reported first, never on purpose."""
    dead = replace(HEALTHY, servers_refusing=("127.0.0.1:30000",))
    actions, reported = decide(dead, NOTHING_YET)
    assert [(a.trigger, a.servers) for a in actions] == [
        (Trigger.SERVER_REFUSED, ("127.0.0.1:30000",))
    ]
    assert triggers(dead, reported) == []
    assert triggers(dead, Reported(failure=True)) == []
    assert triggers(replace(dead, ending_on_purpose=True)) == []


def test_a_server_keeping_a_call_waiting_opens_a_look_once_warm_up_or_not() -> None:
    """Long before the threshold, once a silence; never before the first step, after a
    failure reported first, or on purpose."""
    held = replace(HEALTHY, server_awaited="inference server 127.0.0.1:30001 has not answered")
    actions, reported = decide(held, NOTHING_YET)
    assert [(a.trigger, a.awaited) for a in actions] == [(Trigger.SERVER_CALL, held.server_awaited)]
    assert triggers(held, reported) == []
    assert triggers(replace(held, first_step_seen=False)) == []
    assert triggers(held, Reported(failure=True)) == []
    assert triggers(replace(held, ending_on_purpose=True)) == []


def test_a_silence_is_suspected_then_reported_once() -> None:
    suspected = replace(HEALTHY, silent_for=7.0)
    actions, reported = decide(suspected, Reported())
    assert [a.say for a in actions] == [Say.SUSPECTED]
    assert triggers(suspected, reported) == []  # said once
    stalled = replace(HEALTHY, silent_for=10.5, stalled=True)
    actions, reported = decide(stalled, reported)
    assert [a.trigger for a in actions] == [Trigger.STALL]
    assert triggers(stalled, reported) == []  # reported once per silence
    assert triggers(stalled, progressed(reported)) == [Say.SUSPECTED, Trigger.STALL]  # anew


def test_idle_gpus_report_the_silence_before_the_threshold() -> None:
    idle = replace(HEALTHY, silent_for=31.0, threshold=600.0, gpus_quiet_for=35.0)
    assert triggers(idle) == [Trigger.GPU_IDLE]
    assert triggers(replace(idle, first_step_seen=False)) == []  # models still loading


def test_a_rank_that_exits_while_others_live_waits_out_the_grace() -> None:
    gone = replace(HEALTHY, alive=frozenset({0, 1, 2}), gone=frozenset({3}), gone_since=98.0)
    assert triggers(gone) == []
    assert triggers(replace(gone, now=104.0)) == [Trigger.RANK_EXITED]
    assert triggers(replace(gone, now=104.0, gone_clean=True)) == []  # done, not failed


def test_a_silent_node_is_reported_once_and_ends_the_silence_too() -> None:
    snap = replace(
        HEALTHY, silent_nodes=("node2",), silent_job_nodes=1, silent_for=11, stalled=True
    )
    actions, reported = decide(snap, Reported())
    assert [(a.trigger, a.lost) for a in actions] == [(Trigger.NODE_SILENT, ("node2",))]
    assert reported.failure and reported.silence
    assert triggers(snap, reported) == []


def test_the_job_ending_finishes_and_a_failure_is_reported_first() -> None:
    ended = replace(HEALTHY, ended_nodes=2, alive=frozenset())
    assert triggers(ended) == [Say.FINISHED]
    actions, _ = decide(replace(ended, failed=True), Reported())
    assert [(a.trigger, a.say) for a in actions] == [(Trigger.JOB_FAILED, Say.FINISHED)]


def test_an_ending_on_purpose_is_no_failure_and_no_hang() -> None:
    on_purpose = replace(HEALTHY, ending_on_purpose=True)
    assert triggers(replace(on_purpose, ended_nodes=2, failed=True)) == [Say.FINISHED]
    gone = replace(on_purpose, alive=frozenset({0}), gone=frozenset({1}), gone_since=0.0)
    assert triggers(gone) == []
    assert triggers(replace(on_purpose, silent_for=20, stalled=True)) == []


def test_a_lost_worker_node_does_not_end_an_areal_job() -> None:
    """AReaL on Slurm: the job ends with the controller's host; a silent worker node is a lost
    node, reported, not the end of the job."""
    areal = replace(HEALTHY, n_nodes=1, silent_nodes=("node2",), silent_job_nodes=0)
    assert triggers(areal) == [Trigger.NODE_SILENT]
    assert triggers(replace(areal, ended_nodes=1)) == [Trigger.NODE_SILENT, Say.FINISHED]


def test_areal_controller_alone_can_stall() -> None:
    """AReaL on Slurm: no rank on the controller's host, but the controller (a process of the
    job) is alive there: a silence is still a stall."""
    controller_only = replace(HEALTHY, alive=frozenset(), others_alive=1)
    assert triggers(replace(controller_only, silent_for=11, stalled=True))[-1] == Trigger.STALL
    nothing = replace(HEALTHY, alive=frozenset(), others_alive=0)
    assert triggers(replace(nothing, silent_for=11, stalled=True)) == []


def test_nodes_that_fall_silent_while_the_job_is_cancelled_are_not_lost() -> None:
    cancelling = replace(HEALTHY, silent_nodes=("node2",), ending_on_purpose=True)
    assert Trigger.NODE_SILENT not in triggers(cancelling)


def test_a_retry_loop_moves_its_stacks_without_progress() -> None:
    """Episodes rejected and resubmitted change every stack between the two looks; only a new
    step says the job moved (a run caught 'stacks changed: not cancelling' and ran forever)."""
    first = Marks(1, {7: frozenset({("arun_episode", "run_tool")})}, completed={}, servers={})
    second = Marks(1, {7: frozenset({("submit", "put")})}, completed={7: 0}, servers={})
    assert moved(first, second) == ["the stacks of pid 7 changed"]
    assert moved(first, second, steps_only=True) == []
    assert moved(first, replace(second, step=2), steps_only=True) == ["a new step (2)"]


RAY_WEDGED = (
    Path(__file__).parent / "data/rollout/inference_wedged--areal-spmd-ray-existing-cluster.json"
)


def _main_frames(evidence: Evidence, role: str | None) -> list[Frame]:
    process = next(p for p in evidence.processes() if p.role == role)
    return process.main_thread().frames


def test_a_process_polling_in_a_wait_has_not_moved_until_it_leaves_it() -> None:
    """A real Ray hang (a wedged server): AReaL's Ray launcher polls in ``RayLauncher.wait``,
    asleep or in ``ray.get`` by turns, and the trainer polls in ``prepare_batch``. A CI run's
    second look sampled the launcher in the other call, said "the stacks of pid N changed" and
    left the hung job running; only a process that leaves its wait has moved."""
    first = Evidence.from_dict(json.loads(RAY_WEDGED.read_text()))
    second = copy.deepcopy(first)
    launcher, trainer = _main_frames(second, "controller"), _main_frames(second, None)
    assert launcher[0].name == "RayLauncher.wait" and trainer[0].name == "Condition.wait"
    launcher[:0] = [Frame("get_objects", "ray/_private/worker.py", 900), Frame("get", "w.py", 1)]
    trainer[:2] = [Frame("BatchTaskDispatcher._check_errors", trainer[1].filename, 310)]
    assert moved(marks(first, 1), marks(second, 1)) == []
    pid = next(p.pid for p in second.processes() if p.role is None)
    del trainer[: next(i for i, f in enumerate(trainer) if f.name == "PPOTrainer.train")]
    trainer.insert(0, Frame("FSDPEngine.train_batch", trainer[0].filename, 700))
    assert moved(marks(first, 1), marks(second, 1)) == [f"the stacks of pid {pid} changed"]


def test_after_a_failure_was_reported_no_stall_is_suspected() -> None:
    """A job that failed (reported once) and whose processes linger is not "stall suspected"
    (a Ray run said so after its job had failed)."""
    lingering = replace(HEALTHY, silent_for=7.0)
    assert Say.SUSPECTED in triggers(lingering)
    assert Say.SUSPECTED not in triggers(lingering, Reported(failure=True))


def test_a_job_whose_ranks_never_start_stalls_at_the_startup_timeout() -> None:
    """Nothing registered, nothing ended: torchrun waits at a rendezvous a node never joined."""
    before = replace(HEALTHY, first_step_seen=False, alive=frozenset(), ended_nodes=1,
                     failed=True, silent_for=12.0, threshold=30.0)  # fmt: skip
    assert triggers(before) == []
    assert triggers(replace(before, silent_for=31.0, stalled=True)) == [
        Say.SUSPECTED, Trigger.STALL,
    ]  # fmt: skip
    ended = replace(before, gone=frozenset({0, 1}), silent_for=31.0, stalled=True)
    assert triggers(ended) == []  # ranks that ran and ended are no start-up


def test_ranks_blocked_in_the_kernel_open_a_look_warm_up_or_not() -> None:
    """Storage that stopped answering: ranks in D with nothing moving for 8 s open a look at
    once, before any threshold (the warm-up's 60 s floor would come far later); 7 s do not."""
    early = replace(HEALTHY, threshold=60.0, silent_for=9.0)
    assert triggers(replace(early, in_kernel_for=7.9)) == []
    assert triggers(replace(early, in_kernel_for=8.0)) == [Trigger.IN_KERNEL]
    assert triggers(replace(early, in_kernel_for=30.0, ending_on_purpose=True)) == []
