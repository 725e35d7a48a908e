"""HangBench's scoring, the function its headline stands on: a hang counts as right only when
found with the right kind and (where the label names one) the right culprit, every count is
over every labelled run, found or not, and a signal before the hang or past the case's limit is
no find."""

from __future__ import annotations

from pathlib import Path

from benchmarks.hangbench.cases import Case, Label
from benchmarks.hangbench.runs import Run, label_doubt
from benchmarks.hangbench.scorecard import Score, markdown, read, score, totals, write
from benchmarks.hangbench.tools import Signal

STEP_3_AT = 100.0  # when the last good step's line arrived
META = {"when": "now", "repeat": 1, "minutes": 1.0, "commit": "abc1234", "machine": "2 cores"}


def case(name: str, label: Label) -> Case:
    return Case(name, Path("/cases") / name, name, Path("/cases/p.py"), {}, label, limit=25.0)


def run_of(c: Case) -> Run:
    return Run(c, Path("/r"), Path("/r/run"), 90.0, [(STEP_3_AT, "Train step 3/10 done")], 3)


STUCK = case("stuck", Label(False, "collective_stuck", (2,), after_step=3))
MISMATCH = case("mismatch", Label(False, "collective_mismatch", (), after_step=3))
HEALTHY = case("quiet", Label(True))


def scored(c: Case, signal: Signal | None, tool: str = "t") -> Score:
    return score(c, run_of(c), tool, 0, signal, window=30.0)


def test_right_needs_the_kind_and_the_labelled_culprit() -> None:
    assert scored(STUCK, Signal(106.5, "collective_stuck", (2,))).right
    wrong_rank = scored(STUCK, Signal(106.5, "collective_stuck", (1,)))
    assert wrong_rank.detected and not wrong_rank.right and wrong_rank.culprit_ok is False
    assert not scored(STUCK, Signal(106.5, "straggler", (2,))).right
    assert scored(MISMATCH, Signal(103.0, "collective_mismatch")).right  # no rank labelled
    assert scored(STUCK, Signal(106.5, "rank_crashed/collective_stuck", (2,))).right


def test_a_signal_before_the_hang_or_past_the_limit_is_no_find() -> None:
    early = scored(STUCK, Signal(99.0, "collective_stuck", (2,)))
    assert early.false_alarm and not early.detected and not early.right
    late = scored(STUCK, Signal(STEP_3_AT + 25.0 + 5.1, "collective_stuck", (2,)))
    assert late.signal is None and not late.detected and late.culprit_labelled


def test_the_totals_count_every_labelled_run_found_or_not() -> None:
    scores = [
        scored(STUCK, Signal(104.0, "collective_stuck", (2,))),  # right, 4 s
        scored(STUCK, Signal(110.0, "collective_stuck", (0,))),  # found, wrong culprit, 10 s
        scored(STUCK, None),  # missed: still counted among the culprit cases
        scored(MISMATCH, Signal(101.0, "collective_mismatch")),  # right, 1 s
        scored(HEALTHY, Signal(95.0, "straggler", (0,))),  # a false alarm
        scored(HEALTHY, None),
        Score("stuck", "t", 1, False, empty="needs a GPU"),  # not run: counted nowhere
        Score("stuck", "t", 2, False, doubt="label doubt: step 4 was printed"),  # no score
    ]
    line = totals(scores, "t")
    assert (line["right"], line["detected"], line["hangs"]) == (2, 3, 4)
    assert (line["right_culprit"], line["culprit_cases"]) == (1, 3)
    assert (line["min_s"], line["median_s"], line["max_s"]) == (1.0, 4.0, 10.0)
    assert (line["false_alarms"], line["healthy"], line["empty"], line["doubts"]) == (1, 2, 1, 1)
    table = markdown(scores, [STUCK, MISMATCH, HEALTHY], ["t"], [line], META)
    assert table.startswith("HangBench, now, on abc1234 (2 cores): 3 cases (1 healthy)")
    assert "1 run(s) contradicted their label and score for no tool" in table
    assert "- (label doubt: step 4 was printed)" in table
    assert "| t | **2 of 4** | 3 of 4 | 1.0 / 4.0 / 10.0 | 3 of 4 | 1 of 3 | 1 of 2 |" in table


def test_a_healthy_cell_shows_that_its_phase_ran_and_what_the_tool_saw() -> None:
    """A quiet healthy run is only a pass where its phase ran: the cell says the longest
    silence between steps and the looks the watchdog wrote without posting."""
    steps = [(100.0, "Train step 9/16 done"), (100.3, "Train step 10/16 done"),
             (121.0, "Train step 11/16 done")]  # fmt: skip
    run = Run(HEALTHY, Path("/r"), Path("/r/run"), 90.0, steps, 0)
    quiet = score(HEALTHY, run, "t", 0, None, 30.0, saw="2 look(s) written, not posted")
    assert round(quiet.silence_s or 0, 1) == 20.7 and not quiet.false_alarm
    table = markdown([quiet], [HEALTHY], ["t"], [totals([quiet], "t")], META)
    assert "quiet (silence 21 s; 2 look(s) written, not posted)" in table
    compile_first = Run(HEALTHY, Path("/r"), Path("/r/run"), 90.0, [(115.0, "Train step 1/16")], 0)
    assert compile_first.longest_silence() == 25.0  # a first step's phase counts from the start


def test_a_tool_whose_own_timeout_is_longer_is_waited_for_and_no_longer() -> None:
    at_58 = Signal(STEP_3_AT + 58.0, "", ())
    assert score(STUCK, run_of(STUCK), "torch-tuned", 0, at_58, window=65.0).detected
    assert not score(STUCK, run_of(STUCK), "torch-default", 0, at_58, window=30.0).detected


def test_a_scorecard_read_back_is_what_was_written(tmp_path: Path) -> None:
    """``--resume`` goes on from scorecard.json: every score comes back as it was scored."""
    scores = [scored(STUCK, Signal(104.0, "collective_stuck", (2,), "rank 2")), scored(STUCK, None)]
    write(scores, [STUCK], ["t"], tmp_path, {**META, "subset": ""})
    meta, back = read(tmp_path / "scorecard.json")
    assert back == scores and meta["commit"] == "abc1234" and back[0].right


def test_a_partial_run_says_how_far_it_got_and_where_it_was_resumed() -> None:
    one = [scored(STUCK, None)]
    meta = {**META, "cells": 6, "resumed_on": ["def5678"]}
    table = markdown(one, [STUCK], ["t"], [totals(one, "t")], meta)
    assert table.startswith("HangBench, now, on abc1234, resumed on def5678 (2 cores)")
    assert "**Partial: 1 of 6 cells so far.**" in table
    assert "Partial" not in markdown(one, [STUCK], ["t"], [totals(one, "t")], META)


def test_a_servers_hang_is_right_only_naming_the_server_the_job_started() -> None:
    """The culprit of a server case is the server the label names: the address the job's
    server said it served on, and no rank."""
    dead = case("dead", Label(False, "inference_unreachable", (), 3, culprit_server=True))
    lines = [
        (90.5, "[sglang-standin] serving /m on 127.0.0.1:32735"),
        (STEP_3_AT, "Train step 3/9"),
    ]
    run = Run(dead, Path("/r"), Path("/r/run"), 90.0, lines, None)

    def named(*servers: str, ranks: tuple[int, ...] = ()) -> Score:
        signal = Signal(104.0, "rollout_stalled/inference_unreachable", ranks, "", servers)
        return score(dead, run, "t", 0, signal, window=30.0)

    assert named("127.0.0.1:32735").right
    assert not named("127.0.0.1:40000").right and named("127.0.0.1:40000").culprit_ok is False
    assert not named().right  # the kind alone is no longer enough
    assert not named("127.0.0.1:32735", ranks=(0,)).right
    missed = score(dead, run, "t", 0, None, window=30.0)
    assert totals([named("127.0.0.1:32735"), missed], "t")["culprit_cases"] == 2


def test_a_run_contradicting_its_label_is_a_doubt_but_a_labelled_race_is_not() -> None:
    """A step printed after the hang's (or the hang's never printed) scores for no tool; the
    one step the label says a race prints or not is no contradiction."""
    raced = case("raced", Label(False, "collective_mismatch", (2,), 2, racing_step=3))

    def doubt(c: Case, *steps: int) -> str:
        lines = [(100.0 + s, f"Train step {s}/6 done") for s in steps]
        return label_doubt(Run(c, Path("/r"), Path("/r/run"), 90.0, lines, None))

    assert doubt(raced, 1, 2) == "" and doubt(raced, 1, 2, 3) == ""
    assert doubt(raced, 1, 2, 3, 4) == "label doubt: step 4 was printed after the hang's step 2"
    assert doubt(STUCK, 1, 2, 3, 4).startswith("label doubt: step 4")
    assert doubt(STUCK, 1, 2) == "label doubt: step 3 was never printed (last: 2)"
