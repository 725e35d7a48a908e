"""What ends a silence, and when, on recorded looks and a fake clock: proof acts at the first
look, the hard limit is named when it decided, a working GPU is movement, damage is posted as a
warning while the job goes on. What users see: which looks post, which end the job, and why."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from desk import THRESHOLD, desk, recorded

from areal_watchdog.diagnose.movement import marks, moved
from areal_watchdog.evidence.gpu import GpuSample, IdleTracker
from areal_watchdog.evidence.listeners.flight_recorder import parse_trace
from areal_watchdog.evidence.model import Evidence
from areal_watchdog.watch.silence.escalation import summary_prefix

DATA = Path(__file__).parent / "data"


def with_record(evidence: Evidence, dumps: str) -> Evidence:
    """The stacks of a real hang with the Flight Recorder dumps of a real one beside them."""
    traces = {}
    for path in sorted((DATA / "flight_recorder" / dumps / "json").iterdir()):
        traces[path.name.split("_")[1].split(".")[0]] = parse_trace(path.read_bytes())
    evidence.flight_records = traces
    return evidence


def test_a_mismatch_the_flight_recorder_proves_is_posted_at_the_first_look() -> None:
    """Rank 2 issued ``broadcast`` where ranks 0, 1 and 3 issued ``all_reduce`` at the same
    sequence number: no second look is waited for."""
    d = desk(with_record(recorded("evidence/collective_mismatch_w4_r2.json"), "mismatch_w4_r2"))
    d.stall(THRESHOLD)
    (report,) = d.reports
    assert (report["category"], report["action"], report["posted"]) == (
        "collective_mismatch", "cancel", True
    )  # fmt: skip
    assert report["confirmation"]["by"] == "evidence" and report["at"] == THRESHOLD


def test_a_mismatch_of_stacks_alone_or_a_tie_still_waits_for_the_second_look() -> None:
    for evidence in (
        recorded("evidence/collective_mismatch_w4_r2.json"),
        recorded("evidence/collective_mismatch_w2_r0-1--two-rank-tie.json"),
    ):
        d = desk(evidence)
        d.stall(THRESHOLD)
        assert d.reports == [] and "a second look in 10 s" in d.lines[-1]
        d.run_until(THRESHOLD + 10)
        assert d.reports[-1]["confirmation"]["by"] == "second_look"


def test_a_hard_limit_due_with_the_second_look_is_named_for_it() -> None:
    """The order CI's load produced (issue 42): the first look (a paused server, provable)
    took 15 s, so when its second look fell due the hard limit (40 s) had passed too, and the
    second look found episodes inside a tool (only time decides). The hard limit ended it."""
    d = desk(
        recorded("rollout/inference_paused.json"),
        recorded("rollout/workflow_stuck--areal-single-controller.json"),
    )
    d.configure(cancel_after=40.0)
    d.look_takes = 15.0
    d.stall(THRESHOLD)
    d.run_until(100)
    hard = d.reports[-1]
    assert (hard["action"], hard["posted"], hard["confirmation"]["by"]) == (
        "cancel", True, "hard_limit"
    )  # fmt: skip
    assert summary_prefix(hard["confirmation"]).startswith("No new step for watchdog.cancel_after")


def test_a_second_look_that_finds_a_wait_only_time_decides_does_not_end_the_job() -> None:
    """The second look began before the hard limit, took long, and names a wait inside a
    tool: written, not posted; the hard limit ends it later, and says so."""
    d = desk(
        recorded("rollout/inference_paused.json"),
        recorded("rollout/workflow_stuck--areal-single-controller.json"),
    )
    d.configure(cancel_after=60.0)
    d.stall(THRESHOLD)
    d.look_takes = 25.0  # the second look, due at 40 s, ends at 65 s
    d.run_until(THRESHOLD + 10)
    assert [(r["posted"], r["cause"]) for r in d.reports] == [(False, "workflow_stuck")]
    assert not d.cancelling
    d.run_until(200)
    assert d.reports[-1]["confirmation"]["by"] == "hard_limit" and d.cancelling


def test_damage_is_posted_once_as_a_warning_and_the_job_goes_on() -> None:
    """Episodes wait on a reward function that never returns: AReaL scores them 0 after its
    timeout, so episodes complete and steps may even come. Posted at once, as a warning, and
    never again for the same finding; the job is not cancelled for it (only the hard limit
    would end a silence that lasts)."""
    stuck = recorded("rollout/reward_stuck--areal-single-controller.json")
    timed_out = copy.deepcopy(stuck)
    worker = next(p for p in timed_out.processes() if p.tasks)
    worker.tasks_ended = {"ok": 4, "failed": 0, "cancelled": 0}  # the timeouts, scored 0
    d = desk(stuck, timed_out, stuck)
    d.stall(THRESHOLD)
    (warning,) = d.reports
    assert (warning["cause"], warning["action"], warning["posted"]) == (
        "reward_stuck", "report", True
    )  # fmt: skip
    assert warning["confirmation"]["warning"] is True
    assert summary_prefix(warning["confirmation"]).startswith("Warning: the job goes on")
    d.run_until(THRESHOLD * 4)
    assert not d.cancelling
    assert [r["posted"] for r in d.reports] == [True]  # not posted again
    d.run_until(300, step_at=THRESHOLD * 4 + 5)  # the job steps on (with zero rewards)
    d.stall(d.now + THRESHOLD)  # a later silence finds the same damage: not posted again
    assert [r["posted"] for r in d.reports] == [True, False]


def test_completions_that_are_reward_timeouts_are_no_movement() -> None:
    first = recorded("rollout/reward_stuck--areal-single-controller.json")
    second = copy.deepcopy(first)
    next(p for p in second.processes() if p.tasks).tasks_ended = {"ok": 4}
    assert moved(marks(first, 3), marks(second, 3), damage=True) == []
    assert moved(marks(first, 3), marks(second, 3)) != []


H200 = DATA / "gpu" / "h200" / "nvml_samples.jsonl"


def h200_look(evidence: Evidence, tracker: IdleTracker, start: float, until: float) -> Evidence:
    """``evidence`` with both ranks on the H200's GPU 0 as NVML read it from ``start`` to
    ``until``: the recorded samples of a real H200 (idle from 3 s, 4096 x 4096 matmuls from
    15 s)."""
    for line in H200.read_text().splitlines():
        frame = json.loads(line)
        if start <= frame["t"] <= until:
            tracker.update([GpuSample(**g) for g in frame["gpus"]], set(), now=frame["t"])
    look = copy.deepcopy(evidence)
    for rank in look.ranks:
        rank.gpu = tracker.per_index()[0]
    return look


def test_a_gpu_that_worked_between_the_looks_is_busy_not_hung() -> None:
    """A silent evaluation on the GPU (no step line; the stacks in one function at both
    looks): the second look reads the H200 working at ~600 W and does not cancel; a GPU idle
    at both looks (a host-side hang) moved nothing."""
    stacks = recorded("evidence/straggler_w2_r1.json")
    tracker = IdleTracker()
    first = h200_look(stacks, tracker, 0.0, 12.0)  # idle
    second = h200_look(stacks, tracker, 12.1, 23.0)  # working
    (what,) = moved(marks(first, 3), marks(second, 3))
    assert what.startswith("ranks 0-1 busy (GPU 0 working at ")
    assert what.endswith(" W, shared by ranks 0-1), not hung")
    idle_tracker = IdleTracker()
    idle_first = h200_look(stacks, idle_tracker, 0.0, 6.0)
    idle_second = h200_look(stacks, idle_tracker, 6.1, 12.0)
    assert moved(marks(idle_first, 3), marks(idle_second, 3)) == []


def test_a_spinning_gpu_is_no_movement() -> None:
    """NCCL waiting on a peer: 100 % busy at a tenth of the power limit, at both looks."""
    stacks = recorded("evidence/collective_stuck_w3_r1.json")
    tracker = IdleTracker()
    spin = GpuSample(0, "GPU-0", 100.0, 1000.0, 80000.0, 70.0, 700.0, [])
    looks = []
    for now in (0.0, 5.0):
        tracker.update([spin], set(), now=now)
        look = copy.deepcopy(stacks)
        for rank in look.ranks:
            rank.gpu = tracker.per_index()[0]
        looks.append(look)
    assert looks[1].ranks[0].gpu["state"] == "spinning"
    assert moved(marks(looks[0], 3), marks(looks[1], 3)) == []
