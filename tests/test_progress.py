"""Progress signals: step lines (AReaL's real one included), log following, the stall clock."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import regex

from areal_watchdog.config.model import DEFAULT_STEP_REGEX
from areal_watchdog.rundir.progress.pace import interval_summary
from areal_watchdog.watch.progress.stall_clock import StallClock, learned_threshold
from areal_watchdog.watch.progress.step_log import GLOB_EVERY, StepLogTail, find_progress

AREAL_LINE = (
    "\x1b[32m(AReaL) 20260829-00:00:00.000 StatsLogger INFO:\x1b[0m Epoch 2/2 "
    "Step 3/233 Train step 236/466 done."
)


@pytest.mark.parametrize(
    ("line", "step"),
    [
        (AREAL_LINE, 236),
        (
            "(AReaL) 20260829-00:00:00.000 StatsLogger INFO: Epoch 1/1 Step 3/233 Train step 3/233 "
            "done.",
            3,
        ),
        ("[default0]:step 12 loss=0.3", 12),
        ("Step 12/100 | lr 1e-5", 12),
        ("global_step=12 reward=0.5", 12),
        ("iteration 12 took 3.1s", 12),
        ("Training completes! Total time elapsed 12.", None),
        ("loading 12 shards", None),
    ],
)
def test_default_step_regex(line: str, step: int | None) -> None:
    assert find_progress(line, regex.compile(DEFAULT_STEP_REGEX))[0] == step


def test_log_tail_reads_only_new_lines_and_survives_partial_lines_and_rotation(
    tmp_path: Path,
) -> None:
    log = tmp_path / "trainer.log"
    log.write_text("step 1\nstep 2\n")  # an earlier attempt's lines: ignored
    tail = StepLogTail([str(tmp_path / "*.log")], DEFAULT_STEP_REGEX)
    assert tail.poll() == []
    with log.open("a") as fh:
        fh.write("step 3\nste")
    assert tail.poll() == [3]
    with log.open("a") as fh:
        fh.write("p 4\n")
    assert tail.poll() == [4]
    log.write_text("step 1\n")  # truncated / rotated: read from the start
    assert tail.poll() == [1]
    (tmp_path / "new.log").write_text("step 9\n")  # a file that appears later: read fully,
    assert sum((tail.poll() for _ in range(GLOB_EVERY)), []) == [9]  # found within 10 polls


def test_step_intervals_come_from_the_step_lines_own_timestamps(tmp_path: Path) -> None:
    """0.5 s steps seen by polls a second apart: the intervals are the lines' 0.5 s, not the
    polls' 0 s and 1 s; a line without a timestamp falls back to the poll's time."""
    log = tmp_path / "main.log"
    log.write_text("")
    tail = StepLogTail([str(log)], DEFAULT_STEP_REGEX)
    tail.poll()
    clock = StallClock(None, 60.0, started_at=0.0)
    lines = [AREAL_LINE.replace("00:00:00.000", f"00:00:0{i // 2}.{5 * (i % 2)}00")
                       .replace("236/466", f"{i}/466") for i in range(1, 6)]  # fmt: skip
    for now, chunk in ((1.0, lines[:2]), (2.0, lines[2:3]), (3.0, lines[3:])):
        with log.open("a") as fh:
            fh.write("".join(line + "\n" for line in chunk))
        for step in tail.poll():
            clock.step(step, now, tail.stamps.get(step))
    assert list(clock.intervals) == [0.5, 0.5, 0.5, 0.5]
    assert clock.stats["median"] == 0.5
    clock.step(6, 9.0)  # a heartbeat: no timestamp of its own
    assert clock.intervals[-1] == 6.0


def test_the_phases_areal_announces_are_read_and_other_lines_are_not(tmp_path: Path) -> None:
    """AReaL 1.0.4's and 2.0.0's own lines (the Recover and Archon loggers, colours on)."""
    log = tmp_path / "main.log"
    log.write_text("")
    tail = StepLogTail([str(log)], DEFAULT_STEP_REGEX)
    tail.poll()
    said = {
        "\x1b[36m(AReaL) 20261128-10:00:00.123 Recover INFO:\x1b[0m Saved recover checkpoint to "
        "/ckpt/recover (with_optim=True)": "the recover checkpoint saved",
        "(AReaL) 20261128-10:00:01.000 [Archon Engine Rank 0] INFO: Saving HF checkpoint to "
        "/ckpt/hf": "saving an HF checkpoint (Archon)",
        "(AReaL) 20261128-10:00:02.000 Recover INFO: Loading recover info from /r/info.json": (
            "loading the recover checkpoint"
        ),
        "print('Saved recover checkpoint to x')  # not AReaL's logger": None,
    }
    for line, phase in said.items():
        with log.open("a") as fh:
            fh.write(line + "\n")
        assert (tail.poll(), tail.phase) == ([], phase)
    assert tail.poll() == [] and tail.phase is None  # said once


def test_a_second_look_in_the_warm_up_is_timed_by_the_steps_so_far() -> None:
    """Before the learned threshold (60 s at the least in the warm-up), a second look waits
    half of what the steps so far would give, not half the floor."""
    clock = StallClock(None, 60.0, started_at=0.0)
    clock.step(1, 10.0)
    clock.step(2, 10.3)
    assert clock.threshold == 60.0 and clock.stepping_basis == 5.0
    assert StallClock(8.0, 60.0, started_at=0.0).stepping_basis == 60.0  # before any step


def test_stall_clock_fixed_threshold_and_startup() -> None:
    clock = StallClock(stall_timeout=10, startup_timeout=100, started_at=0.0)
    assert clock.threshold == 100 and not clock.stalled(99)
    assert clock.step(1, now=50)
    assert clock.threshold == 10
    assert not clock.step(1, now=55)  # the same step again is not progress
    assert clock.stalled(61) and not clock.stalled(59)


def test_stall_clock_auto_learns_from_intervals() -> None:
    """The default: the start-up timeout until an interval is seen, generous limits for the
    first steps, then 3 x the 99th percentile of the intervals, never below 5 s."""
    clock = StallClock(stall_timeout=None, startup_timeout=300, started_at=0.0)
    clock.step(1, now=100)
    assert clock.threshold == 300  # no interval seen yet: step 1 may have included start-up
    clock.step(2, now=102)
    assert clock.threshold == 60  # warming up: at least a minute
    clock.step(3, now=120)
    assert clock.threshold == 90  # warming up: 5 x the longest interval (18 s)
    for step in range(4, 40):
        clock.step(step, now=120 + (step - 3) * 0.5)
    assert clock.learned and clock.threshold == 54  # 3 x the p99 (18 s, still in the window)
    for step in range(40, 400):
        clock.step(step, now=clock.last_progress_at + 0.5)
    assert clock.threshold == 5.0  # 3 x 0.5 s is below the floor
    assert not clock.stalled(clock.last_progress_at + 4.9)
    assert clock.stalled(clock.last_progress_at + 5.1)


def test_a_learned_threshold_follows_slow_steps_and_ignores_one_outlier() -> None:
    """Steps of 40 s with jitter: the threshold is 3 x their p99; one 200 s step among 256 is
    above the 99th percentile and does not raise it (it is not the 1 % the quantile keeps)."""
    clock = StallClock(stall_timeout=None, startup_timeout=300, started_at=0.0)
    now = 0.0
    for step in range(300):
        now += 200.0 if step == 250 else 40.0 + (step % 7)
        clock.step(step, now=now)
    assert clock.threshold == 3 * 46.0
    assert learned_threshold(interval_summary([40.0] * 100), 3.0, 5.0) == 120.0


def test_an_explicit_stall_timeout_wins_over_the_learned_one() -> None:
    clock = StallClock(stall_timeout=30, startup_timeout=300, started_at=0.0)
    for step in range(10):
        clock.step(step, now=float(step))
    assert clock.threshold == 30 and not clock.learned


def test_the_silence_after_the_last_step_is_teardown_judged_by_its_own_timeout(
    tmp_path: Path,
) -> None:
    log = tmp_path / "main.log"
    log.write_text("")
    tail = StepLogTail([str(log)], DEFAULT_STEP_REGEX)
    tail.poll()
    log.write_text("Epoch 1/1 Step 2/3 Train step 2/3 done.\n")
    assert (tail.poll(), tail.total) == ([2], 3)
    clock = StallClock(stall_timeout=10, startup_timeout=100, teardown_timeout=60, started_at=0)
    clock.total = tail.total
    clock.step(2, now=0)
    assert clock.threshold == 10 and clock.stalled(11)
    clock.step(3, now=20)  # the last step: what follows is teardown
    assert clock.tearing_down and clock.threshold == 60
    assert not clock.stalled(79) and clock.stalled(81)
    plain = StallClock(stall_timeout=10, startup_timeout=100, started_at=0)
    plain.step(3, now=0)  # no total said: every silence is judged alike
    assert not plain.tearing_down and plain.stalled(11)


def test_stall_clock_hold_suspends_detection() -> None:
    clock = StallClock(stall_timeout=10, startup_timeout=100, started_at=0.0)
    clock.step(1, now=0)
    clock.hold(now=25)  # a pause announced while silent
    assert not clock.stalled(30)
    assert clock.stalled(36)


def test_a_backtracking_step_pattern_cannot_pin_the_sidecar(tmp_path) -> None:
    """The issue's pattern on 40-character lines: Python's re would take minutes per line."""
    log = tmp_path / "train.log"
    log.write_text("")
    tail = StepLogTail([str(log)], r"(?:\w+\s?)*Train step (?P<step>\d+)")
    tail.poll()
    log.write_text("a" * 40 + "\n" + "(AReaL) Train step 7 done.\n" + "b" * 40 + "\n")
    started = time.perf_counter()
    steps = tail.poll()
    assert time.perf_counter() - started < 1.0
    assert steps == [7]


def test_a_nodes_heartbeats_are_read_with_one_listing_and_no_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight ranks of a node heartbeat through the public API; the sidecar learns their highest
    step from one directory listing, opening nothing (a pause file only while one is listed);
    another run's heartbeats and another node's do not count."""
    import areal_watchdog.rundir.progress.heartbeat as api
    from areal_watchdog.rundir.layout import RunLayout
    from areal_watchdog.watch.progress import heartbeats

    layout = RunLayout(tmp_path / "run")
    monkeypatch.setenv("AREAL_WATCHDOG_DIR", str(layout.watch_dir))
    monkeypatch.setenv("AREAL_WATCHDOG_NODE", "node1")
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)

    def beacon(rank: int, run_id: str) -> api._Beacon:
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("AREAL_WATCHDOG_RUN_ID", run_id)
        return api._Beacon()

    ranks = [beacon(r, "r1") for r in range(8)]
    for step in range(1, 4):
        for rank in ranks[: 8 if step < 3 else 1]:  # rank 0 alone reaches step 3
            rank.beat(step)
            rank.beat(None)  # alive: changes nothing
    beacon(9, "old").beat(99)  # a stale run's
    opened: list[Path] = []
    monkeypatch.setattr(heartbeats, "read_json", lambda p: opened.append(p))
    state = heartbeats.read_heartbeats(layout, "r1", "node1")
    assert (state.max_step, opened) == (3, [])
    assert len(list(layout.heartbeats("node1").iterdir())) == 9  # one name per rank, renamed
    assert heartbeats.read_heartbeats(layout, "r1", "node2").max_step is None
    monkeypatch.undo()
    monkeypatch.setenv("AREAL_WATCHDOG_DIR", str(layout.watch_dir))
    monkeypatch.setenv("AREAL_WATCHDOG_NODE", "node1")
    monkeypatch.setenv("AREAL_WATCHDOG_RUN_ID", "r1")
    monkeypatch.setattr(api, "_beacon", None)
    with api.expect_pause(60, "checkpoint"):
        state = heartbeats.read_heartbeats(layout, "r1", "node1")
        assert state.pause_reason == "checkpoint" and state.pause_until > time.time() + 50
    assert heartbeats.read_heartbeats(layout, "r1", "node1").pause_until == 0.0
