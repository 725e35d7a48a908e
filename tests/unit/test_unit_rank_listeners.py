"""The listeners a rank runs for the sidecar, answered through their FIFOs as the sidecar asks:
the Flight Recorder dump (``rank.flight_recorder``, in this process: its thread is ended) and
the asyncio task dump (``rank.asyncio_tasks.task_listener``, in a child process with a pending
task)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

from areal_watchdog.evidence.listeners import flight_recorder
from areal_watchdog.rank.asyncio_tasks import task_listener
from areal_watchdog.rank.flight_recorder import start_listener
from areal_watchdog.rundir.layout import RunLayout

REPO = Path(__file__).resolve().parents[2]


def wait_for(path: Path, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert path.exists(), f"{path} never appeared"


def start_process(source: str, run_dir: Path) -> subprocess.Popen:
    """A child running ``source`` with this checkout importable, its stdout read as text."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", source, str(run_dir)], env=env, text=True, stdout=subprocess.PIPE
    )


def test_the_flight_recorder_listener_answers_each_request_with_a_record(tmp_path: Path) -> None:
    """No process group in this process: the rank answers with why there is no trace, never
    silence (the sidecar would wait out its timeout)."""
    layout = RunLayout(tmp_path)
    before = set(threading.enumerate())
    start_listener(layout, 3)
    (thread,) = set(threading.enumerate()) - before
    trigger = layout.fr_trigger(3)
    try:
        mode = os.stat(trigger).st_mode
        assert stat.S_ISFIFO(mode) and stat.S_IMODE(mode) == 0o600
        with open(trigger, "w") as fifo:
            fifo.write("request-1\n")
        wait_for(layout.fr_dump(3))
        record = json.loads(layout.fr_dump(3).read_text())
        assert (record["request"], record["rank"]) == ("request-1", 3)
        assert "torch.distributed is not initialised" in record["error"]
    finally:  # wake the thread with nothing to do and its FIFO gone: it ends
        fd = os.open(trigger, os.O_WRONLY)
        trigger.unlink()
        os.close(fd)
        thread.join(timeout=2.0)
    assert not thread.is_alive()


TASKS_PROCESS = """
import asyncio, sys
from pathlib import Path
from areal_watchdog.rank.asyncio_tasks import task_listener
from areal_watchdog.rundir.layout import RunLayout

async def call_the_tool():
    await asyncio.sleep(30)

async def main():
    task = asyncio.create_task(call_the_tool(), name="episode-7")
    await asyncio.sleep(0)
    print(task_listener.start(RunLayout(Path(sys.argv[1]))), flush=True)
    await task

asyncio.run(main())
"""


def test_the_task_listener_dumps_the_pending_coroutines_on_request(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    proc = start_process(TASKS_PROCESS, tmp_path)
    try:
        assert proc.stdout.readline() == "True\n"
        fd = os.open(layout.tasks_trigger(proc.pid), os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, b"req-42\n")
        finally:
            os.close(fd)
        dump = layout.tasks_dump(proc.pid)
        wait_for(dump)
        record = json.loads(dump.read_text())
    finally:
        proc.kill()
        proc.wait()
    assert (record["request"], record["pid"]) == ("req-42", proc.pid)
    names = {t["name"]: t for t in record["tasks"]}
    assert "episode-7" in names
    assert "call_the_tool" in json.dumps(names["episode-7"]["chain"])  # where it waits


def test_no_task_listener_where_its_folder_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "watchdog").write_text("a file where the folder should be")
    before = set(threading.enumerate())
    assert task_listener.start(RunLayout(tmp_path)) is False
    assert set(threading.enumerate()) == before


LISTENER_PROCESS = """
import sys, time
from pathlib import Path
from areal_watchdog.rank.flight_recorder import start_listener
from areal_watchdog.rundir.layout import RunLayout

start_listener(RunLayout(Path(sys.argv[1])), 3)
print("listening", flush=True)
time.sleep(60)
"""


def test_a_listener_stopped_as_the_sidecar_asks_is_asked_again_once_it_runs(
    tmp_path: Path,
) -> None:
    """A stopped process has no reader on its FIFO (its thread's ``open()`` was interrupted and
    restarts when it runs again): py-spy's blocking dump, just before the Flight Recorder is
    asked, stops every rank. The trigger is tried again, and the rank's answer counts; a rank
    without any listener still costs nothing."""
    layout = RunLayout(tmp_path)
    proc = start_process(LISTENER_PROCESS, tmp_path)
    resume = threading.Timer(0.3, os.kill, (proc.pid, signal.SIGCONT))
    try:
        assert proc.stdout.readline() == "listening\n"
        time.sleep(0.2)  # until the thread is in its open()
        os.kill(proc.pid, signal.SIGSTOP)
        resume.start()
        traces = flight_recorder.collect(layout, [3], timeout=5.0)
        assert "torch.distributed is not initialised" in traces[3]["error"], traces
        started = time.monotonic()
        assert flight_recorder.collect(layout, [4], timeout=5.0) == {}
        assert time.monotonic() - started < 0.5
    finally:
        resume.cancel()
        proc.kill()
        proc.wait()
