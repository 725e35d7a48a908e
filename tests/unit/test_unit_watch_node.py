"""One node's part of the job as the sidecar sees it (``watch.processes.node_watch``), with one real
rank: a child process that our rank wrapper (``rank.main``) runs, found through its environment, its
stack taken by the cooperative faulthandler dump, its end noticed."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from areal_watchdog.evidence.discovery import Scope
from areal_watchdog.evidence.gather import GatherSettings
from areal_watchdog.rundir.layout import ENV_NODE, ENV_RUN_ID, ENV_WATCH_DIR, RunLayout
from areal_watchdog.watch.processes.node_watch import NodeWatch

REPO = Path(__file__).resolve().parents[2]
RANK_SCRIPT = """
import time

def wait_in_the_collective():
    time.sleep(30)

wait_in_the_collective()
"""


def start_rank(tmp_path: Path, run_id: str, source: str = RANK_SCRIPT) -> subprocess.Popen:
    script = tmp_path / "train.py"
    script.write_text(source)
    env = {
        **os.environ, ENV_RUN_ID: run_id, ENV_WATCH_DIR: str(RunLayout(tmp_path).watch_dir),
        ENV_NODE: "n1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
        "PYTHONPATH": str(REPO),
    }  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "areal_watchdog.rank.main", str(script)], env=env, cwd=tmp_path
    )


def wait_for(path: Path, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert path.exists(), f"{path} never appeared"


@contextlib.contextmanager
def watched_rank(
    tmp_path: Path, source: str = RANK_SCRIPT, log: Callable[[str], None] = lambda _line: None
) -> Iterator[tuple[RunLayout, NodeWatch, subprocess.Popen]]:
    """One real rank, registered and seen by the node's watch; killed at the end."""
    run_id = f"unit-{uuid.uuid4().hex}"
    layout = RunLayout(tmp_path)
    watch = NodeWatch(layout, Scope(run_id, "n1", world_size=1), expected=1, log=log)
    rank = start_rank(tmp_path, run_id, source)
    try:
        wait_for(layout.registration(0, "n1"))
        watch.refresh(time.time())
        yield layout, watch, rank
    finally:
        rank.kill()
        rank.wait()


def test_a_rank_is_found_its_stack_taken_and_its_end_noticed(tmp_path: Path) -> None:
    lines: list[str] = []
    with watched_rank(tmp_path, log=lines.append) as (_, watch, rank):
        assert watch.summary() == {
            "ranks_alive": {"0": rank.pid}, "ranks_gone": [], "ranks_done": [],
            "workers_alive": [], "servers": None, "servers_refusing": [],
            "gpu_use": None, "ranks_in_kernel_since": {},  # no server, no GPU, not in D
        }  # fmt: skip
        assert watch.pids() == [rank.pid] and watch.local_ranks() == [0]
        time.sleep(0.1)  # until the rank is inside its script
        (item,) = watch.evidence(GatherSettings("faulthandler", timeout=3.0))
        assert (item.rank, item.pid, item.node) == (0, rank.pid, "n1")
        names = [f.name for t in item.threads for f in t.frames]
        assert "wait_in_the_collective" in names
        rank.kill()
        rank.wait()
        watch.refresh(time.time())
        assert watch.summary()["ranks_gone"] == [0] and watch.summary()["ranks_alive"] == {}
        assert watch.summary()["ranks_done"] == []  # killed: no clean return
        assert lines[-1].endswith("exited; 0 ranks alive here")


def test_a_rank_that_returns_is_done_not_failed(tmp_path: Path) -> None:
    with watched_rank(tmp_path, "import time\ntime.sleep(1)\n") as (_, watch, rank):
        rank.wait(timeout=30)
        watch.refresh(time.time())
        assert watch.summary()["ranks_gone"] == watch.summary()["ranks_done"] == [0]


def test_the_end_of_the_node_s_job_lists_every_process_as_gone(tmp_path: Path) -> None:
    with watched_rank(tmp_path) as (_, watch, _rank):
        watch.all_gone()
        assert watch.summary()["ranks_gone"] == [0] and watch.pids() == []


FAKE_PYSPY = """#!/bin/sh
# py-spy as a loaded machine answers it: MODE is late (a blocking dump never finishes),
# late-always (nor one without suspending), or refused (ptrace denied).
case "{mode}:$*" in
  refused:*) echo "Error: Permission denied (os error 13)" >&2; exit 1 ;;
  late:*--nonblocking*) echo '[{{"thread_id": 1, "thread_name": "MainThread", "active": false,
    "owns_gil": false, "frames": [{{"name": "wait_in_the_collective", "filename": "train.py",
    "line": 5}}]}}]'; exit 0 ;;
  *) exec sleep 30 ;;
esac
"""


@pytest.mark.parametrize(
    ("mode", "method", "state"),
    [("late", "py-spy", "blocked"), ("late-always", "none", "unresponsive"),
     ("refused", "faulthandler", "blocked")],
)  # fmt: skip
def test_a_late_py_spy_is_asked_again_without_suspending_and_never_signals_the_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, method: str, state: str
) -> None:
    """Only a refused py-spy falls back to the rank's own faulthandler. A late one (a busy
    many-threaded process) is read once more without suspending it; the rank is never sent
    the cooperative signal for it (CI saw a rollout worker segfault inside that dump)."""
    fake = tmp_path / "py-spy"
    fake.write_text(FAKE_PYSPY.format(mode=mode))
    fake.chmod(0o755)
    monkeypatch.setattr("areal_watchdog.evidence.pyspy.pyspy_executable", lambda: str(fake))
    with watched_rank(tmp_path) as (layout, watch, rank):
        time.sleep(0.1)  # until the rank is inside its script
        (item,) = watch.evidence(GatherSettings("auto", timeout=1.0))
        assert (item.evidence_method, item.state) == (method, state), item.error
        dumped = layout.stack_file(0).read_text()
        assert ("wait_in_the_collective" in dumped) == (method == "faulthandler")
        names = [f.name for t in item.threads for f in t.frames]
        assert ("wait_in_the_collective" in names) == (state == "blocked")
        if mode == "late-always":
            assert item.error == (
                "py-spy did not answer within 1 s; "
                "py-spy did not answer within 1 s (not suspending it)"
            )
        assert rank.poll() is None


def test_a_server_refusing_is_named_unless_the_jobs_other_parts_end_with_it(
    tmp_path: Path,
) -> None:
    """A server that answered once and refuses now is named in the node's status; when a rollout
    worker here ended within 10 s of it, it is the job's teardown stopping its servers."""
    watch = NodeWatch(RunLayout(tmp_path), Scope("r1", "n1", world_size=1), expected=1)
    watch.pulse.answered.add("127.0.0.1:30000")
    watch.pulse.refusing["127.0.0.1:30000"] = 100.0
    watch.server_pids.add(41)
    watch.ended_at[41] = 99.0  # the server's own process: no teardown
    assert watch.summary()["servers_refusing"] == ["127.0.0.1:30000"]
    watch.ended_at[42] = 95.0  # a rollout worker ended 5 s before: a teardown
    assert watch.summary()["servers_refusing"] == []
    watch.ended_at[42] = 80.0  # long before: unrelated
    assert watch.summary()["servers_refusing"] == ["127.0.0.1:30000"]
