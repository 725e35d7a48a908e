"""How a silence escalates to ``on_hang``, driven with recorded evidence and a fake clock: no
process, no file. What users see: which looks end the job, which are only written, what moved.

The looks are recorded evidence of real hangs (``tests/data``); the desk is the real
``Escalation`` of the sidecar's incident desk with its gathering and writing replaced."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from desk import THRESHOLD, desk, moving, recorded

from areal_watchdog.diagnose.movement import marks, moved
from areal_watchdog.evidence.trigger import Trigger
from areal_watchdog.report.run_status import status_lines
from areal_watchdog.report.write import prune_oldest
from areal_watchdog.watch.silence.escalation import summary_prefix
from areal_watchdog.watch.silence.stall_case import StallCase


def test_conclusive_evidence_ends_the_job_at_the_first_look() -> None:
    """A server that refuses connections: nothing comes back, no second look is waited for."""
    d = desk(recorded("rollout/inference_unreachable.json"))
    d.stall(THRESHOLD)
    (report,) = d.reports
    assert (report["cause"], report["action"], report["posted"]) == (
        "inference_unreachable", "cancel", True
    )  # fmt: skip
    assert report["confirmation"]["by"] == "evidence"


def test_a_look_the_server_call_sensor_opened_is_looked_at_again_in_2_s() -> None:
    """The sensor watched the held call for 5 s before the first look: the second look only
    checks that nothing moved since, 2 s later, where a stall's waits half a step (10 s at most);
    a configured confirm_after still rules."""
    d = desk(recorded("evidence/collective_mismatch_w4_r2.json"))
    usual = min(10.0, THRESHOLD / 2)
    for trigger, delay in ((Trigger.STALL, usual), (Trigger.SERVER_CALL, 2.0)):
        d.escalation.case = StallCase(trigger, 3, (), "cancel")
        assert d.escalation.confirm_delay() == delay
    d.configure(confirm_after=6)
    assert d.escalation.confirm_delay() == 6


def test_a_dismissed_look_is_looked_at_again_and_a_later_look_confirms() -> None:
    """The second look saw movement: written, not posted, not cancelled; a threshold later the
    job is looked at again, nothing moves this time, and the job is cancelled (posted)."""
    first = recorded("evidence/collective_mismatch_w4_r2.json")
    d = desk(first, moving(first), first, first)
    d.stall(THRESHOLD)
    assert d.reports == [] and "a second look in 10 s" in d.lines[-1]
    d.run_until(THRESHOLD + 10)
    (dismissed,) = d.reports
    assert dismissed["action"] == "report" and dismissed["posted"] is False
    assert dismissed["confirmation"]["confirmed"] is False
    assert dismissed["confirmation"]["after_s"] == 10.0
    d.run_until(THRESHOLD + 10 + THRESHOLD + 10)
    assert [r["action"] for r in d.reports] == ["report", "cancel"]
    confirmed = d.reports[-1]
    assert confirmed["posted"] and confirmed["confirmation"]["by"] == "second_look"
    assert confirmed["confirmation"]["look"] == 2
    assert any(line.startswith("still no new step: look 2") for line in d.lines)


def test_a_wait_no_stack_can_judge_is_left_to_the_hard_limit() -> None:
    """Every episode waits inside a tool (``workflow_stuck``): as slow a tool as a dead one.
    Suspected once (written, not posted, not repeated at the later looks); at the hard limit
    (5 thresholds without a step) the job is cancelled whatever moved."""
    d = desk(recorded("rollout/workflow_stuck--areal-single-controller.json"))
    d.stall(THRESHOLD)
    d.run_until(5 * THRESHOLD - 1)
    (suspected,) = d.reports
    assert suspected["posted"] is False and suspected["confirmation"]["cancel_after_s"] == 150
    assert "Suspected, not confirmed: no stack tells" in summary_prefix(suspected["confirmation"])
    d.run_until(5 * THRESHOLD + 1)
    hard = d.reports[-1]
    assert (hard["action"], hard["posted"], hard["confirmation"]["by"]) == (
        "cancel", True, "hard_limit"
    )  # fmt: skip
    assert hard["at"] == 5 * THRESHOLD
    assert summary_prefix(hard["confirmation"]).startswith(
        "No new step for watchdog.cancel_after (150 s)"
    )


def test_a_slow_phase_that_recovers_is_never_posted_or_cancelled() -> None:
    """The same wait, but the tool returns 45 s after the last step (threshold 30 s): the
    step ends the case; nobody is paged, nothing is cancelled."""
    d = desk(recorded("rollout/workflow_stuck--areal-single-controller.json"))
    d.stall(THRESHOLD)
    d.run_until(200, step_at=45)
    assert d.case is None and not d.cancelling
    assert [r["posted"] for r in d.reports] == [False]


def test_the_hard_limit_grows_with_the_job_s_own_step_intervals() -> None:
    """Steps 50 s apart (a saturated server) before this silence: 5 of those, not 5 of the
    threshold, end the job."""
    d = desk(recorded("rollout/workflow_stuck--areal-single-controller.json"))
    d.clock.step(4, 50.0)
    d.stall(50.0 + THRESHOLD)
    d.run_until(50.0 + 249)
    assert not d.cancelling
    d.run_until(50.0 + 251)
    assert d.reports[-1]["confirmation"]["cancel_after_s"] == 250 and d.cancelling


def test_the_hard_limit_is_configurable() -> None:
    d = desk(recorded("rollout/workflow_stuck--areal-single-controller.json"))
    d.configure(cancel_after=40.0)
    d.stall(THRESHOLD)
    d.run_until(100)
    assert d.reports[-1]["at"] == 40.0 and d.reports[-1]["action"] == "cancel"


def test_tasks_that_end_by_exception_are_no_movement() -> None:
    """A retry loop against a dead server ends its episodes every second, all by exception:
    churn, not progress. Episodes that returned are."""
    first = recorded("rollout/workflow_failing.json")
    second = copy.deepcopy(first)
    worker = next(p for p in second.processes() if p.tasks)
    worker.tasks_ended = {"ok": 0, "failed": 31, "cancelled": 0}
    assert moved(marks(first, 3), marks(second, 3), steps_only=True) == []
    worker.tasks_ended = {"ok": 2, "failed": 31, "cancelled": 0}
    assert moved(marks(first, 3), marks(second, 3), steps_only=True) == [
        f"tasks of pid {worker.pid} completed"
    ]


def test_a_busy_server_is_movement_with_its_numbers() -> None:
    """A saturated server that still generates is busy, not hung: the second look says so."""
    first = recorded("rollout/inference_paused--real-vllm.json")
    second = copy.deepcopy(first)
    for probe, tokens in ((first.servers[0], 1000.0), (second.servers[0], 7012.0)):
        probe.update(generated_tokens=tokens, requests_done=40.0, running=2.0, queued=70.0)
    second.servers[0]["time"] = first.servers[0]["time"] + 10.0
    (what,) = moved(marks(first, 3), marks(second, 3))
    assert what.endswith(
        "generated 6,012 tokens and completed 0 requests in 10.0 s (601 tokens/s; running 2, "
        "queued 70): busy, not hung"
    )


def test_status_says_which_looks_were_only_written(tmp_path: Path) -> None:
    for name, confirmation in (
        ("20261126T000000Z-a", {"confirmed": False, "by": None}),
        ("20261126T000100Z-b", {"confirmed": True, "by": "hard_limit"}),
    ):
        incident = tmp_path / ("suspected" if name.endswith("a") else "incidents") / name
        incident.mkdir(parents=True)
        report = {"incident_id": name, "category": "rollout_stalled", "culprit_ranks": [],
                  "culprit_nodes": [], "confirmation": confirmation}  # fmt: skip
        (incident / "report.json").write_text(json.dumps(report))
    lines = status_lines(tmp_path, 0.0)
    assert lines[-2].endswith("(suspected, not confirmed: only time tells; not posted)")
    assert lines[-1].endswith("(confirmed by the hard limit)")


def test_only_the_newest_suspected_looks_are_kept(tmp_path: Path) -> None:
    """A job that is slow at every step writes a suspected look each time: the oldest go, a
    link planted among them is never followed."""
    suspected = tmp_path / "suspected"
    for n in range(5):
        (suspected / f"20261126T00000{n}Z-unknown-aaaa").mkdir(parents=True)
        (suspected / f"20261126T00000{n}Z-unknown-aaaa" / "report.json").write_text("{}")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "report.json").write_text("{}")
    (suspected / "00000000T000000Z-link").symlink_to(outside)
    removed = prune_oldest(suspected, 2)
    assert [p.name[:15] for p in removed] == [f"20261126T00000{n}" for n in range(3)]
    assert sorted(p.name[:15] for p in suspected.iterdir() if not p.is_symlink()) == [
        "20261126T000003", "20261126T000004"
    ]  # fmt: skip
    assert (outside / "report.json").exists()


def test_a_look_that_fell_back_to_faulthandler_sees_the_same_place() -> None:
    """Under load py-spy may fail one look and the rank's faulthandler answer it: faulthandler
    names ``sync_metrics`` where py-spy names ``Trainer.sync_metrics``. The ranks are where they
    were (the CI's collective_mismatch runs were not cancelled because of this)."""
    first = recorded("evidence/collective_mismatch_w3_r0.json")
    second = copy.deepcopy(first)
    for rank in second.ranks:
        rank.evidence_method = "faulthandler"
        for thread in rank.threads:
            thread.active = thread.owns_gil = thread.thread_id = None
            thread.name = "MainThread" if thread is rank.main_thread() else None
            for frame in thread.frames:
                frame.name = frame.name.rsplit(".", 1)[-1]
    assert any("." in f.name for r in first.ranks for f in r.main_thread().frames)
    assert moved(marks(first, 3), marks(second, 3)) == []
    assert moved(marks(first, 3), marks(moving(second), 3)) != []
