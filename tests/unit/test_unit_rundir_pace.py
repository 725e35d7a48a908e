"""``areal-launch status`` answers "slow or hung?" from the leader's pace record with the job's
own numbers: the same silence reads differently against different histories and looks."""

from __future__ import annotations

from areal_watchdog.rundir.progress.pace import Pace, answer, interval_summary

STEPS = interval_summary([0.5] * 98 + [0.6, 0.9])


def pace(**changes: object) -> Pace:
    base = {"step": 30, "since": 100.0, "threshold": 5.0, "learned": True, **STEPS}
    return Pace(**{**base, **changes})  # type: ignore[arg-type]


def test_a_step_within_the_job_s_own_times_is_progressing() -> None:
    line, rows = answer(pace(), now=100.2)
    assert line == "progressing: step 31 in progress for 0 s; it should end in about 0 s"
    assert ("steps take", "median 0.5 s, p99 0.6 s, longest 0.9 s (100 intervals)") in rows
    assert ("threshold", "5 s (learned)") in rows


def test_a_step_past_the_p99_but_within_the_threshold_is_slow_not_hung() -> None:
    line, _ = answer(pace(gpus=2, gpus_working=2), now=103.0)
    assert line == (
        "slow, not hung: step 31 in progress for 3 s, longer than 99 % of steps (0.6 s); the "
        "watchdog looks at 5 s; 2 of 2 GPUs working"
    )


def test_past_the_threshold_it_looks_hung_and_names_the_open_look() -> None:
    assert answer(pace(), now=106.0)[0].startswith("looks hung: step 31 in progress for 6 s")
    look = "look 1 suspects collective_stuck, a second look pending"
    line, rows = answer(pace(look=look, look_state="pending"), now=106.0)
    assert line.endswith("past the 5 s threshold; " + look) and ("open look", look) in rows


def test_a_look_only_time_decides_says_so_with_the_hard_limit() -> None:
    look = "look 1 suspects unknown"
    line, _ = answer(pace(look=look, look_state="time", hard_limit=600.0), now=120.0)
    assert line.startswith("slow or hung, undecided: step 31 in progress for 20 s")
    assert line.endswith("the job is ended only after 600 s without a step")


def test_before_the_first_step_it_is_starting_and_a_damaged_record_is_none() -> None:
    line, _ = answer(Pace(None, 0.0, 1800.0, False), now=42.0)
    assert line == "starting: no step yet after 42 s (start-up limit 1800 s)"
    assert Pace.from_dict("garbage") is None and Pace.from_dict({"step": 1}) is None
    forged = {**pace().to_dict(), "threshold": "600; rm -rf"}  # a hand-edited status: no traceback
    assert Pace.from_dict(forged) is None
    assert Pace.from_dict({**pace().to_dict(), "step": True}) is None
    assert Pace.from_dict(pace().to_dict()) == pace()
