"""The sidecar asks a process for its pending asyncio tasks: a real process running the rank's
listener answers with each task's await chain; a process that listens to nothing costs no wait,
and a stale dump is never taken for an answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from areal_watchdog.evidence.listeners.tasks import collect
from areal_watchdog.rundir.layout import RunLayout

REPO = Path(__file__).resolve().parents[2]

# A process whose one rollout episode waits forever, with the rank's task listener running.
EPISODE = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from areal_watchdog.rank.asyncio_tasks import task_listener
    from areal_watchdog.rundir.layout import RunLayout

    async def arun_episode():
        await asyncio.sleep(600)

    async def main():
        task = asyncio.create_task(arun_episode(), name="episode-0")
        await asyncio.sleep(0)
        assert task_listener.start(RunLayout(Path(sys.argv[1])))
        print("ready", flush=True)
        await task

    asyncio.run(main())
    """
)


def test_a_listening_process_answers_with_its_pending_episode(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's listener
    proc = subprocess.Popen(
        [sys.executable, "-c", EPISODE, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        dumps = collect(layout, [proc.pid], timeout=5.0)
    finally:
        proc.kill()
        proc.wait(timeout=5)
    assert list(dumps) == [proc.pid]
    dump = dumps[proc.pid]
    assert dump["pid"] == proc.pid
    (task,) = [t for t in dump["tasks"] if t["name"] == "episode-0"]
    assert [link["name"].rsplit(".", 1)[-1] for link in task["chain"]][0] == "arun_episode"


def test_a_process_that_listens_to_nothing_costs_no_wait(tmp_path: Path) -> None:
    started = time.monotonic()
    assert collect(RunLayout(tmp_path), [os.getpid()], timeout=5.0) == {}
    assert time.monotonic() - started < 0.5


def test_a_stale_dump_is_not_an_answer(tmp_path: Path) -> None:
    """Someone listens but never answers: the dump of an earlier request is left alone."""
    layout = RunLayout(tmp_path)
    layout.tasks_dir.mkdir(parents=True)
    pid = os.getpid()
    os.mkfifo(layout.tasks_trigger(pid), 0o600)
    stale = {"request": "older-request", "pid": pid, "tasks": [{"name": "old"}]}
    layout.tasks_dump(pid).write_text(json.dumps(stale))
    reader = os.open(layout.tasks_trigger(pid), os.O_RDONLY | os.O_NONBLOCK)  # a listener
    try:
        assert collect(layout, [pid], timeout=0.3) == {}
        assert os.read(reader, 4096).decode().strip().startswith(f"{os.getpid()}-")  # was asked
    finally:
        os.close(reader)
