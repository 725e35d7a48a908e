"""What a process writes to its own logs, told apart from its data by real processes' file
positions (``/proc/PID/fdinfo``), and the repeated line a report quotes from a retry loop."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from areal_watchdog.diagnose.one_process.log_flood import repeated_line
from areal_watchdog.evidence.kernel_readings.log_writes import LogMeter

WRITER = """
import os, sys, time
log, data = open(sys.argv[1], "a"), open(sys.argv[2], "wb")
sys.stdin.readline()
for i in range(100):
    log.write(f"WARNING retry {i}: connection refused\\n" * 100); log.flush()
    data.write(os.urandom(4096)); data.flush()
time.sleep(30)
"""


def test_writes_to_a_log_are_counted_and_data_is_not(tmp_path: Path) -> None:
    log, data = tmp_path / "worker.log", tmp_path / "shard.bin"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(log), str(data)],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        time.sleep(0.5)
        meter = LogMeter(proc.pid)
        assert meter.window() == 0  # the first window only starts counting
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        time.sleep(1.0)
        assert meter.window() == log.stat().st_size  # every line, and none of the 400 KB data
        assert meter.window() == 0  # nothing since
    finally:
        proc.kill()
        proc.wait()


def test_a_stderr_that_repeats_one_line_is_quoted() -> None:
    tail = "--- stdout.log ---\n" + "step 1 done\n" * 20 + "--- stderr.log ---\n"
    tail += "".join(f"WARNING retry {i}: connection refused by 127.0.0.1:9\n" for i in range(18))
    tail += "Traceback (most recent call last):\nValueError: x\n"
    assert repeated_line(tail) == ("WARNING retry 17: connection refused by 127.0.0.1:9", 18, 20)
    assert repeated_line("--- stdout.log ---\n" + "step 1 done\n" * 40) is None  # steps repeat
    varied = "--- stderr.log ---\n" + "".join(f"loading shard {c}\n" for c in "abcdefghij")
    assert repeated_line(varied) is None
