"""Stacks without ptrace: what a real Python process's ``faulthandler`` writes, read back as the
threads the classifier judges (the main thread named, frames innermost first), and a signalled
process answering into its stack file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from areal_watchdog.evidence.listeners.faulthandler import dump_cooperative, parse_faulthandler
from areal_watchdog.evidence.pyspy import StackError

# A worker thread parked in worker_wait(); the main thread dumps from inner() <- outer().
DUMPER = textwrap.dedent(
    """
    import faulthandler, sys, threading
    ready, stop = threading.Event(), threading.Event()
    def worker_wait():
        ready.set()
        stop.wait()
    threading.Thread(target=worker_wait, daemon=True).start()
    ready.wait()
    def inner():
        faulthandler.dump_traceback(file=sys.stdout, all_threads=True)
    def outer():
        inner()
    outer()
    stop.set()
    """
)

# Arms faulthandler on SIGUSR1 into a file, says so, then blocks in hang() until killed.
COOPERATIVE = textwrap.dedent(
    """
    import faulthandler, signal, sys, time
    out = open(sys.argv[1], "a")
    faulthandler.register(signal.SIGUSR1, file=out, all_threads=True)
    def hang():
        print("ready", flush=True)
        time.sleep(60)
    hang()
    """
)


def test_a_real_dump_reads_as_threads_with_the_main_thread_named() -> None:
    text = subprocess.run(
        [sys.executable, "-c", DUMPER], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    threads = parse_faulthandler(text)
    assert len(threads) == 2
    main = threads[-1]
    assert main.name == "MainThread"
    assert [f.name for f in main.frames] == ["inner", "outer", "<module>"]
    assert main.frames[0].filename == "<string>" and main.frames[0].line > 0
    worker = threads[0]
    assert worker.name is None  # faulthandler gives no thread names
    assert "worker_wait" in [f.name for f in worker.frames]
    assert worker.frames[0].name == "wait" and worker.frames[0].filename.endswith("threading.py")
    assert worker.active is None and worker.owns_gil is None  # unknown, not False


def test_text_that_is_no_dump_gives_no_thread() -> None:
    assert parse_faulthandler("") == []
    assert parse_faulthandler('  File "x.py", line 3 in f\nsome log line\n') == []


def test_a_signalled_rank_answers_into_its_stack_file(tmp_path: Path) -> None:
    stack_file = tmp_path / "rank_0.stacks.txt"
    stack_file.write_text(  # an earlier dump: only what the signal appends is read
        'Current thread 0x0001 (most recent call first):\n  File "old.py", line 1 in old\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", COOPERATIVE, str(stack_file)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        threads = dump_cooperative(proc.pid, signal.SIGUSR1, stack_file, timeout=5.0)
    finally:
        proc.kill()
        proc.wait(timeout=5)
    assert len(threads) == 1
    assert [f.name for f in threads[0].frames] == ["hang", "<module>"]


def test_no_stack_file_is_a_stack_error(tmp_path: Path) -> None:
    with pytest.raises(StackError, match="no cooperative stack file"):
        dump_cooperative(os.getpid(), 0, tmp_path / "absent.txt", timeout=0.1)  # signal 0: none
