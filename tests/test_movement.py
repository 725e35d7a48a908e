"""What counts as movement between two looks at a silent job, one test per row of the table in
docs/how-it-works.md ("What moves"), on recorded evidence of real hangs with each process's own
counters set as a real checkpoint, evaluation or spin loop leaves them (measured here: a rank
blocked in a collective moves about 0.3 KB/s through read and write calls while watched; a
160 MB checkpoint in fsync'd 1 MB chunks 6.7 MB/s). The desk is the real ``Escalation``."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
from desk import THRESHOLD, desk, recorded

from areal_watchdog.diagnose.classify import classify
from areal_watchdog.diagnose.movement import marks, moved
from areal_watchdog.diagnose.one_process.activity import work_thread
from areal_watchdog.diagnose.strength import strength
from areal_watchdog.evidence.kernel_readings.counters import (
    Counters,
    rates,
    read_counters,
    real_data,
)
from areal_watchdog.evidence.kernel_readings.process_movement import IoWindow, ProcessMovement
from areal_watchdog.evidence.kernel_readings.sockets import parse_ss
from areal_watchdog.evidence.model import RUNNING, Evidence, Frame, plain
from areal_watchdog.evidence.process_tree import TreeMeter
from areal_watchdog.watch.silence.escalation import summary_prefix

CHECKPOINT = 6.7e6  # bytes a second: 1 MB fsync'd chunks every 0.15 s
WATCHED_FLOOR = 300.0  # bytes a second a blocked rank moves while the sensor asks it


def with_io(evidence: Evidence, pid: int, rates: list[float], start: float = 0.0) -> Evidence:
    """The same look, ``pid``'s poll windows (a second each, from ``start``) at ``rates``."""
    later = copy.deepcopy(evidence)
    for process in later.processes():
        windows = [IoWindow(start + i + 1, WATCHED_FLOOR, 0.0, 0.0) for i in range(len(rates))]
        if process.pid == pid:
            windows = [IoWindow(start + i + 1, r, r, 0.0) for i, r in enumerate(rates)]
        process.movement = ProcessMovement(Counters(start + len(rates), 1.0), tuple(windows))
    return later


def straggler() -> tuple[Evidence, int]:
    """Rank 2 of 4 in its own code while the others wait in all_reduce, and its pid."""
    evidence = recorded("evidence/straggler_w4_r2--worker-busy.json")
    (culprit,) = [r for r in evidence.ranks if r.rank == 2]
    return evidence, culprit.pid


def test_a_rank_writing_real_data_between_the_looks_is_busy_not_hung() -> None:
    """Rank 2 writes a checkpoint in one function while the others wait: the second look finds
    its stack where it was but its bytes moving, so the job is not cancelled."""
    evidence, pid = straggler()
    first = with_io(evidence, pid, [CHECKPOINT] * 3)
    second = with_io(evidence, pid, [CHECKPOINT] * 6)
    (line,) = moved(marks(first, 3), marks(second, 3))
    assert line.startswith(f"rank 2 (pid {pid}) read or wrote 6.7 MB/s in 3 of 3 polls")
    d = desk(first, second, second)
    d.stall(THRESHOLD)
    d.run_until(THRESHOLD + 11)
    assert [(r["posted"], r["action"]) for r in d.reports] == [(False, "report")]


def test_our_own_floor_and_one_window_of_a_looks_dumps_are_no_movement() -> None:
    """A blocked rank under the sensor (0.3 KB/s), and one window in which the look's own
    Flight Recorder dump was written (1 MB): nothing moved, the straggler is confirmed."""
    evidence, pid = straggler()
    first = with_io(evidence, pid, [WATCHED_FLOOR] * 3)
    second = with_io(evidence, pid, [WATCHED_FLOOR] * 3 + [1e6, WATCHED_FLOOR, WATCHED_FLOOR])
    assert moved(marks(first, 3), marks(second, 3)) == []
    d = desk(first, second)
    d.stall(THRESHOLD)
    d.run_until(THRESHOLD + 11)
    (report,) = d.reports
    assert (report["category"], report["action"], report["posted"]) == (
        "straggler", "cancel", True
    )  # fmt: skip


def every_rank_running(evidence: Evidence, culprit: int) -> Evidence:
    """Every rank in the culprit's own code, burning CPU: an evaluation on the CPU."""
    later = copy.deepcopy(evidence)
    (busy,) = [r for r in later.ranks if r.rank == culprit]
    for rank in later.ranks:
        rank.threads, rank.state, rank.cpu_utilization = copy.deepcopy(busy.threads), RUNNING, 1.0
    return later


def test_every_rank_running_its_own_code_is_a_slow_phase_left_to_the_hard_limit() -> None:
    """Every rank evaluates on the CPU (none in a collective), in the same functions at both
    looks: written, not posted, until the hard limit (5 thresholds)."""
    evidence, _ = straggler()
    evaluating = every_rank_running(evidence, 2)
    verdict = classify(evaluating)
    assert (verdict.category, strength(verdict)) == ("unknown", "time")
    d = desk(evaluating)
    d.stall(THRESHOLD)
    d.run_until(5 * THRESHOLD - 1)
    assert [(r["posted"], r["action"]) for r in d.reports] == [(False, "report")]
    d.run_until(5 * THRESHOLD + 1)
    assert d.reports[-1]["confirmation"]["by"] == "hard_limit"


def test_a_few_ranks_spinning_in_the_same_frames_while_the_rest_wait_are_a_straggler() -> None:
    evidence, pid = straggler()
    first, second = with_io(evidence, pid, [0.0] * 3), with_io(evidence, pid, [0.0] * 6)
    d = desk(first, second)
    d.stall(THRESHOLD)
    d.run_until(THRESHOLD + 11)
    (report,) = d.reports
    assert (report["category"], report["posted"], report["confirmation"]["by"]) == (
        "straggler", True, "second_look"
    )  # fmt: skip


def test_a_rank_blocked_without_cpu_or_io_while_the_rest_wait_is_hung() -> None:
    evidence = recorded("evidence/dataloader_stall_w3_r2.json")
    d = desk(evidence)
    d.stall(THRESHOLD)
    d.run_until(THRESHOLD + 11)
    (report,) = d.reports
    assert (report["category"], report["posted"]) == ("dataloader_stall", True)


def test_the_hard_limit_spares_a_job_writing_at_a_real_rate_and_ends_one_that_spins() -> None:
    """All ranks in their own code, one writing a checkpoint for longer than the hard limit:
    at the limit it still writes, so the job is looked at again a threshold later; when it
    only spins there, the job is ended (posted)."""
    evidence, pid = straggler()
    base = every_rank_running(evidence, 2)
    writing = [with_io(base, pid, [CHECKPOINT] * 30, start=30.0 * i) for i in range(8)]
    d = desk(*writing)
    d.stall(THRESHOLD)
    d.run_until(5 * THRESHOLD + 1)
    assert not d.cancelling and "past the hard limit" in d.lines[-1]
    assert "read or wrote 6.7 MB/s" in d.lines[-1]
    spinning = [with_io(base, pid, [0.0] * 30, start=30.0 * i) for i in range(8)]
    d = desk(*spinning)
    d.stall(THRESHOLD)
    d.run_until(5 * THRESHOLD + 1)
    assert d.cancelling and d.reports[-1]["confirmation"]["by"] == "hard_limit"
    # it wrote, then stopped: ended at the first look past the limit that saw nothing move
    d = desk(*writing[:5], *spinning[5:])
    d.stall(THRESHOLD)
    d.run_until(8 * THRESHOLD)
    assert d.cancelling and d.reports[-1]["confirmation"]["by"] == "hard_limit"


def test_the_working_threads_functions_and_a_new_step_still_move() -> None:
    evidence, pid = straggler()
    later = with_io(evidence, pid, [0.0] * 3)
    (rank0,) = [r for r in later.ranks if r.rank == 0]
    rank0.threads[0].frames.append(Frame("elsewhere", "/job/train.py", 9))
    assert moved(marks(with_io(evidence, pid, [0.0]), 3), marks(later, 4))[0] == "a new step (4)"


def test_a_processs_own_counters_see_its_writes(tmp_path: Path) -> None:
    """The counters every look reads: 4 MB written and fsync'd show in wchar and as a rate far
    above the floor; a process that does nothing moves nothing."""
    writer = subprocess.Popen(
        [sys.executable, "-c", "import sys, os, time\nsys.stdin.readline()\n"
         f"f = open({str(tmp_path / 'ckpt')!r}, 'wb')\n"
         "for _ in range(4):\n f.write(os.urandom(1 << 20)); f.flush(); os.fsync(f.fileno())\n"
         "time.sleep(30)"],
        stdin=subprocess.PIPE,
    )  # fmt: skip
    try:
        handle = psutil.Process(writer.pid)
        time.sleep(0.5)
        before = read_counters(handle, time.time())
        writer.stdin.write(b"go\n")
        writer.stdin.flush()
        time.sleep(1.0)
        after = read_counters(handle, time.time())
        assert after.write_chars - before.write_chars >= 4 << 20
        rate = rates(before, after)
        assert real_data(rate["io"], rate["disk"])
        still = read_counters(handle, time.time() + 1.0)
        quiet = rates(after, still)
        assert not real_data(quiet["io"], quiet.get("disk", 0.0))
    finally:
        writer.kill()
        writer.wait()
    assert read_counters(handle, time.time()) is None  # gone


SS_SAMPLE = (  # ``ss -tinpH`` here, a 320 KB/s upload to a slow endpoint on 127.0.0.1
    'ESTAB 0      3429888 127.0.0.1:35840 127.0.0.1:29912 users:(("python",pid=9414,fd=3))\n'
    "\t bbr wscale:10,10 rto:220 bytes_sent:848384 bytes_retrans:272384 bytes_acked:576001 "
    "segs_out:27 segs_in:16 data_segs_out:20 delivered:21 notsent:3429888 minrtt:0.033\n"
    'ESTAB 0      0 127.0.0.1:29912 127.0.0.1:35840 users:(("python",pid=9413,fd=4))\n'
    "\t cubic bytes_received:576001 segs_in:20\n"
)


def test_a_rank_uploading_over_tcp_between_the_looks_is_busy_not_hung() -> None:
    """An upload moves no ``wchar``: the bytes its TCP sockets carried (``ss``) do."""
    assert parse_ss(SS_SAMPLE, {9414, 9413, 1}) == {9414: 576001, 9413: 576001}
    assert parse_ss(SS_SAMPLE, {1}) == {}
    evidence, pid = straggler()
    first, second = with_io(evidence, pid, [0.0] * 3), with_io(evidence, pid, [0.0] * 6)
    for look, (at, carried) in ((first, (3.0, 576001)), (second, (6.0, 1536001))):
        for process in look.processes():
            process.movement = ProcessMovement(
                Counters(at, 1.0), tcp_bytes=carried if process.pid == pid else 0
            )
    (line,) = moved(marks(first, 3), marks(second, 3))
    assert line == f"rank 2 (pid {pid}) sent or received 0.32 MB/s over TCP since the first look " \
        "(an upload, a download): busy, not hung"  # fmt: skip
    for process in second.processes():  # a stalled upload: nothing acknowledged since
        process.movement = ProcessMovement(
            Counters(6.0, 1.0), tcp_bytes=576001 if process.pid == pid else 0
        )
    assert moved(marks(first, 3), marks(second, 3)) == []


def test_a_rank_seen_in_two_functions_among_one_looks_samples_moves() -> None:
    """A slow node's evaluation, sampled three times a look: the same function at both looks'
    first samples (a forward pass), a scoring loop in a later one of the first look: it moves,
    while a straggler's three samples in its one loop at each look do not."""
    evidence, pid = straggler()
    (culprit,) = [r for r in evidence.ranks if r.pid == pid]
    spinning = [copy.deepcopy(culprit.threads), copy.deepcopy(culprit.threads)]
    first, second = with_io(evidence, pid, [0.0] * 3), with_io(evidence, pid, [0.0] * 6)
    for look in (first, second):
        (rank,) = [r for r in look.ranks if r.pid == pid]
        rank.samples = copy.deepcopy(spinning)
    assert moved(marks(first, 3), marks(second, 3)) == []
    (rank,) = [r for r in first.ranks if r.pid == pid]
    rank.samples[1][0].frames.insert(0, Frame("score_answers", "/job/phases.py", 98))
    assert moved(marks(first, 3), marks(second, 3)) == [f"the stacks of pid {pid} changed"]


def with_windows(evidence: Evidence, pid: int, windows: list[list[float]]) -> Evidence:
    """The same look, ``pid``'s poll windows as given (end, io, disk, children's cores, log)."""
    later = copy.deepcopy(evidence)
    for process in later.processes():
        own = windows if process.pid == pid else [[w[0], WATCHED_FLOOR, 0, 0, 0] for w in windows]
        movement = ProcessMovement(Counters(windows[-1][0], 1.0), tuple(IoWindow(*w) for w in own))
        process.movement = movement
    return later


def test_a_ranks_children_at_work_are_its_movement() -> None:
    """Rank 2 blocked while its DataLoader worker burns a core (its own CPU, and I/O, nil):
    the second look dismisses; the same rank with idle children is hung."""
    evidence, pid = straggler()
    busy = [[float(i + 1), 0.0, 0.0, 0.95, 0.0] for i in range(6)]
    (line,) = moved(marks(with_windows(evidence, pid, busy[:3]), 3),
                    marks(with_windows(evidence, pid, busy), 3))  # fmt: skip
    assert line.startswith(f"the child processes of rank 2 (pid {pid}) worked (0.9 cores in 3")
    slow_polls = busy[:3] + busy[4:5]  # a loaded sidecar polled once between the looks
    (line,) = moved(marks(with_windows(evidence, pid, busy[:3]), 3),
                    marks(with_windows(evidence, pid, slow_polls), 3))  # fmt: skip
    assert "worked (0.9 cores in 1 of 1 polls since the first look" in line
    idle = [[float(i + 1), 0.0, 0.0, 0.05, 0.0] for i in range(6)]
    first, second = with_windows(evidence, pid, idle[:3]), with_windows(evidence, pid, idle)
    assert moved(marks(first, 3), marks(second, 3)) == []


SPIN = [sys.executable, "-c", "while True: pass"]


def test_a_starved_child_counts_by_the_cores_it_wants() -> None:
    """A CPU-bound child sharing one core with a hog runs about half the time; the tree counts
    what it wants (ran plus waited to run), so a node whose cores are all taken does not turn
    DataLoader workers into idle children."""
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys\n"
                               f"subprocess.run({SPIN!r})"])  # fmt: skip
    hog = subprocess.Popen(SPIN)
    try:
        meter, deadline = TreeMeter(parent.pid), time.time() + 10
        while not meter.pids() and time.time() < deadline:
            meter.window(time.time())
            time.sleep(0.1)
        (child,) = meter.pids()
        for pid in (child, hog.pid):
            os.sched_setaffinity(pid, {min(os.sched_getaffinity(0))})
        meter.window(time.time())
        ran = psutil.Process(child).cpu_times()
        time.sleep(1.5)
        tree = meter.window(time.time())
        got = (sum(psutil.Process(child).cpu_times()[:2]) - sum(ran[:2])) / 1.5
        assert got < 0.75 and tree.cpu > 0.85, (got, tree)
    finally:
        for process in (parent, hog):
            family = psutil.Process(process.pid).children(recursive=True)
            for member in [psutil.Process(process.pid), *family]:
                with contextlib.suppress(psutil.Error):
                    member.kill()
            process.wait()


def test_a_log_flood_is_no_data_and_the_hard_limit_ends_it() -> None:
    """Rank 2 retries with no back-off and logs every failure at 0.2 MB/s (the log meter took
    it out of its bytes): no movement, so the hard limit ends the job; the same bytes as data
    (a checkpoint) defer it, but not past 3 hard limits."""
    evidence, pid = straggler()
    base = every_rank_running(evidence, 2)
    flood = [[[30.0 * i + j + 1, 300.0, 0.0, 0.0, 2e5] for j in range(30)] for i in range(8)]
    flooding = [with_windows(base, pid, windows) for windows in flood]
    d = desk(*flooding)
    d.stall(THRESHOLD)
    d.run_until(5 * THRESHOLD + 1)
    assert d.cancelling and d.reports[-1]["confirmation"]["by"] == "hard_limit"
    writing = [with_io(base, pid, [CHECKPOINT] * 30, start=30.0 * i) for i in range(40)]
    d = desk(*writing)
    d.stall(THRESHOLD)
    d.run_until(3 * 5 * THRESHOLD - 1)
    assert not d.cancelling
    d.run_until(3 * 5 * THRESHOLD + THRESHOLD + 1)
    assert d.cancelling and d.reports[-1]["confirmation"]["by"] == "hard_limit"


def looping(evidence: Evidence, pid: int, names: list[str]) -> list[Evidence]:
    """Looks at ``pid`` seen in each of ``names`` in turn: a retry loop through several
    functions (normalize, tokenize, validate, again)."""
    found = []
    for name in names:
        look = copy.deepcopy(evidence)
        (process,) = [p for p in look.processes() if p.pid == pid]
        work_thread(process).frames[0].name = name
        found.append(look)
    return found


def test_a_livelock_through_several_functions_is_a_warning_then_the_hard_limit_ends_it() -> None:
    """Rank 2 loops through three functions while the others wait: every second look sees its
    stack move (not cancelled), so past 90 s without a step one warning names the rank and its
    functions, and the hard limit (5 thresholds: 150 s) still ends the job."""
    evidence, pid = straggler()
    looks = looping(evidence, pid, ["normalize", "tokenize", "validate"] * 20)
    d = desk(*looks)
    d.stall(THRESHOLD)
    d.run_until(5 * THRESHOLD - 1)
    warnings = [r for r in d.reports if r["posted"]]
    (warning,) = warnings
    assert warning["action"] == "report" and 90 <= warning["at"] < 5 * THRESHOLD
    livelock = warning["confirmation"]["livelock"]
    assert livelock["ranks"] == [2] and {"normalize", "tokenize"} <= set(livelock["functions"])
    prefix = summary_prefix(warning["confirmation"])
    assert prefix.startswith("Warning: a possible livelock: rank 2")
    assert not d.cancelling
    d.run_until(5 * THRESHOLD + 12)
    assert d.cancelling and d.reports[-1]["confirmation"]["by"] == "hard_limit"


def test_a_livelock_early_in_a_job_is_warned_of_by_90_s_whatever_the_threshold() -> None:
    """HangBench's early livelock: at step 3 the threshold is still 60 s, so looks a threshold
    apart (at 60 and 120 s) would carry the 90 s warning past the 120 s a user is promised; the
    look after a moving one comes when the warning falls due."""
    evidence, pid = straggler()
    d = desk(*looping(evidence, pid, ["normalize", "tokenize", "validate"] * 20))
    d.clock.stall_timeout = 60.0
    d.stall(1.0)
    d.run_until(119.0)
    (warning,) = [r for r in d.reports if r["posted"]]
    assert 90 <= warning["at"] < 110 and warning["confirmation"]["livelock"]["ranks"] == [2]


def test_every_episode_failing_while_the_server_churns_is_a_warning_quoting_its_exception():
    """The recorded run where every episode raises: each second look sees the server generate
    (for episodes that then fail), which dismisses the look, never the retry loop; past 90 s
    without a step one warning names the loop and quotes the exception, and the hard limit
    (5 thresholds: 150 s) still ends the job."""
    first = recorded("rollout/workflow_failing.json")
    looks = []
    for i in range(40):
        churning = copy.deepcopy(first)
        churning.servers[0].update(generated_tokens=256.0 * i, time=1000.0 + 9 * i)
        looks.append(churning)
    d = desk(*looks)
    d.stall(THRESHOLD)
    d.run_until(5 * THRESHOLD - 1)
    (warning,) = [r for r in d.reports if r["posted"]]
    assert warning["action"] == "report" and 90 <= warning["at"] < 5 * THRESHOLD
    assert warning["cause"] == "workflow_failing"
    prefix = summary_prefix(warning["confirmation"])
    assert prefix.startswith("Warning: every episode fails and is retried: no step for ")
    assert not d.cancelling
    d.run_until(5 * THRESHOLD + 12)
    assert d.cancelling and d.reports[-1]["confirmation"]["by"] == "hard_limit"


def test_a_processs_movement_crosses_nodes_whole() -> None:
    """A follower's answer carries each process's movement as JSON: the leader's rules read
    the same typed record back (windows, TCP bytes, time blocked in the kernel)."""
    evidence, pid = straggler()
    (rank,) = [r for r in evidence.ranks if r.pid == pid]
    windows = (IoWindow(1.0, CHECKPOINT, 0.0, 0.95, 12.5), IoWindow(2.0, 0.0, 0.0, 0.0))
    rank.movement = ProcessMovement(Counters(2.0, 1.5, 10, 20, 0, 4096, 7, 1.75), windows, 9, 8.5)
    sent = json.loads(json.dumps(plain(rank)))
    assert Evidence.rank_from_dict(sent).movement == rank.movement
    assert ProcessMovement.from_dict({"counters": "torn"}) is None


def test_storage_that_stops_answering_is_final_only_after_a_minute() -> None:
    """The recorded FUSE stall (every rank in ``read()``, the server silent): storage can fail
    over and answer again, so the first look is written, not posted; a step before 60 s of
    silence ends it quietly, and without one the look at 60 s posts it as proof."""
    stalled = recorded("evidence/storage_stall_w4_r0-1-2-3--fuse-dead.json")
    failover = desk(stalled)
    failover.stall(THRESHOLD)
    failover.run_until(100.0, step_at=45.0)
    assert [r["posted"] for r in failover.reports] == [False]
    dead = desk(stalled)
    dead.stall(THRESHOLD)
    dead.run_until(100.0)
    posted = [r for r in dead.reports if r["posted"]]
    assert [r["category"] for r in posted] == ["storage_stall"] and posted[0]["at"] >= 60
    assert posted[0]["confirmation"]["by"] == "evidence" and dead.cancelling
