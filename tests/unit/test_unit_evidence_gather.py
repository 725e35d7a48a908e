"""What the sidecar reads from the run directory about a process, without touching it: how it
ended (its own exit record, else torchrun's log line), the tail of its newest attempt's logs,
and where its cooperative stack lands. Files only, under ``tmp_path``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from areal_watchdog.evidence.discovery import JobProcess
from areal_watchdog.evidence.gather import LOG_TAIL_LINES, exit_info, rank_log_tails, stack_file
from areal_watchdog.rundir.layout import RunLayout

AGENT_LOG = """\
[E] failed (exitcode: 1) local_rank: 0 (pid: 4242) of binary: python
  exitcode  : -9 (pid: 4243)
"""


def rank_process(rank: int, pid: int, hooked: bool = False) -> JobProcess:
    return JobProcess(pid, "n0", 0.0, rank=rank, local_rank=rank, hooked=hooked)


def test_a_rank_s_own_exit_record_says_how_it_ended(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    layout.ranks_dir.mkdir(parents=True)
    record = {
        "pid": 4242,
        "code": 1,
        "kind": "exception",
        "time": 5.0,
        "exc_type": "RuntimeError",
        "message": "boom",
        "traceback": "...",
    }
    layout.exit_record(0).write_text(json.dumps(record))
    info = exit_info(layout, rank_process(0, 4242), AGENT_LOG)
    assert (info.code, info.kind, info.exc_type, info.message) == (
        1,
        "exception",
        "RuntimeError",
        "boom",
    )


def test_a_record_of_another_pid_is_not_this_process_s_and_torchrun_s_line_is_used(
    tmp_path: Path,
) -> None:
    """A restarted rank keeps its rank number: the old attempt's record must not be read."""
    layout = RunLayout(tmp_path)
    layout.ranks_dir.mkdir(parents=True)
    layout.exit_record(1).write_text(json.dumps({"pid": 1111, "code": 0, "kind": "returned"}))
    info = exit_info(layout, rank_process(1, 4243), AGENT_LOG)
    assert (info.code, info.kind) == (-9, "signal")
    assert exit_info(layout, rank_process(1, 5555), AGENT_LOG).kind == "unknown"


def test_a_hooked_process_keeps_its_files_by_pid(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    assert stack_file(layout, rank_process(2, 77)) == layout.stack_file(2)
    assert stack_file(layout, rank_process(2, 77, hooked=True)) == layout.process_stack_file(77)
    controller = JobProcess(78, "n0", 0.0, role="controller")
    assert stack_file(layout, controller) == layout.process_stack_file(78)
    layout.procs_dir.mkdir(parents=True)
    layout.process_exit_record(78).write_text(json.dumps({"pid": 78, "code": 3, "kind": "exit"}))
    assert exit_info(layout, controller, "").code == 3


def write_attempt(layout: RunLayout, attempt: str, rank: int, stdout: str, mtime: float) -> Path:
    folder = layout.torchrun_logs_dir / "n0" / "job_x" / attempt / str(rank)
    folder.mkdir(parents=True)
    (folder / "stdout.log").write_text(stdout)
    (folder / "stderr.log").write_text("")
    os.utime(folder, (mtime, mtime))
    return folder


def test_log_tails_come_from_the_newest_attempt_and_name_each_stream(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    write_attempt(layout, "attempt_0", 0, "old attempt\n", 1000.0)
    newest = write_attempt(layout, "attempt_1", 0, "step 3\n", 2000.0)
    (newest / "stderr.log").write_text("Traceback: boom\n")
    write_attempt(layout, "attempt_1", 1, "rank 1 here\n", 2000.0)
    tails = rank_log_tails(layout, "n0", {0, None})
    assert tails == {0: "--- stdout.log ---\nstep 3\n--- stderr.log ---\nTraceback: boom"}
    assert rank_log_tails(layout, "n0", {None}) == {}


def test_a_long_log_keeps_its_last_lines_and_never_half_a_line(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    short = [f"short {i}" for i in range(100)]
    write_attempt(layout, "attempt_0", 0, "\n".join(short) + "\n", 1000.0)
    assert rank_log_tails(layout, "n0", {0})[0].splitlines()[1:] == short[-LOG_TAIL_LINES:]
    # 3 KB lines: the last 64 KB read hold fewer than LOG_TAIL_LINES of them, and the first
    # one read starts mid-line (half a line could be half a secret)
    long = [f"line {i:03d} " + "x" * 3000 for i in range(100)]
    write_attempt(layout, "attempt_0", 1, "\n".join(long) + "\n", 1000.0)
    tail = rank_log_tails(layout, "n0", {1})[1].splitlines()[1:]
    assert 0 < len(tail) < LOG_TAIL_LINES
    assert tail == long[-len(tail) :]
