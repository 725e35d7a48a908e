"""The rank wrapper (``rank.main``) and what it arms (``rank.arming``): each rank runs in a child
process that the test ends. What the sidecar relies on: the registration, the exit record (how
the rank ended, its secrets scrubbed), the stack dump on SIGURG."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from areal_watchdog.rank.arming import exit_code, exit_record
from areal_watchdog.rank.main import main
from areal_watchdog.rundir.layout import (
    COOPERATIVE_SIGNAL,
    ENV_NODE,
    ENV_RUN_ID,
    ENV_WATCH_DIR,
    RunLayout,
)

REPO = Path(__file__).resolve().parents[2]
SECRET = "Zq8vLm3xPw7Rk"


def run_rank(tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "train.py"
    path.write_text(script)
    env = {
        **os.environ, ENV_RUN_ID: "r1", ENV_WATCH_DIR: str(RunLayout(tmp_path).watch_dir),
        ENV_NODE: "n1", "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2",
        "PYTHONPATH": str(REPO), "DB_PASSWORD": SECRET,
    }  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "areal_watchdog.rank.main", str(path), *args], env=env,
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip


def test_a_rank_runs_the_script_unchanged_and_records_its_exit(tmp_path: Path) -> None:
    done = run_rank(
        tmp_path,
        "import sys\nprint(__name__, sys.argv[1:])\nsys.exit(3)\n",
        "--config", "job.yaml",
    )  # fmt: skip
    assert done.returncode == 3
    assert done.stdout == "__main__ ['--config', 'job.yaml']\n"
    layout = RunLayout(tmp_path)
    record = json.loads(layout.exit_record(1).read_text())
    assert (record["rank"], record["kind"], record["code"]) == (1, "exit", 3)
    registration = json.loads(layout.registration(1, "n1").read_text())
    assert (registration["run_id"], registration["rank"], registration["node"]) == ("r1", 1, "n1")
    assert registration["world_size"] == 2 and registration["pid"] == record["pid"]
    assert registration["cooperative_signal"] == int(COOPERATIVE_SIGNAL)


def test_a_rank_that_raises_records_the_exception_without_its_secrets(tmp_path: Path) -> None:
    done = run_rank(tmp_path, f"raise ConnectionError('cannot log in with {SECRET}')\n")
    assert done.returncode == 1 and "ConnectionError" in done.stderr
    record = json.loads(RunLayout(tmp_path).exit_record(1).read_text())
    assert (record["kind"], record["code"], record["exc_type"]) == (
        "exception", 1, "ConnectionError"
    )  # fmt: skip
    assert record["message"].startswith("cannot log in with ")
    assert "ConnectionError" in record["traceback"]
    assert SECRET not in json.dumps(record)


def test_a_returning_script_is_recorded_as_returned(tmp_path: Path) -> None:
    assert run_rank(tmp_path, "x = 1\n").returncode == 0
    record = json.loads(RunLayout(tmp_path).exit_record(1).read_text())
    assert (record["kind"], record["code"]) == ("returned", 0)


ARMED = """
import sys, time
from pathlib import Path
from areal_watchdog.rank.arming import arm_stack_dump

kept = arm_stack_dump(Path(sys.argv[1]))
print("armed" if kept else "not armed", flush=True)

def blocked_in_all_reduce():
    time.sleep(30)

blocked_in_all_reduce()
"""


def test_the_stack_dump_answers_sigurg_with_every_thread(tmp_path: Path) -> None:
    stacks = tmp_path / "deep" / "rank_0.stacks.txt"  # its folder is made
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", ARMED, str(stacks)], env=env, text=True, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout.readline() == "armed\n"
        time.sleep(0.05)  # into the sleep
        proc.send_signal(COOPERATIVE_SIGNAL)
        deadline = time.monotonic() + 5
        while "blocked_in_all_reduce" not in stacks.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "blocked_in_all_reduce" in stacks.read_text()
        assert proc.poll() is None  # the signal harmed nothing
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_exit_codes_and_records_as_the_sidecar_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [exit_code(c) for c in (None, 0, 7, "fatal: no data")] == [0, 0, 7, 1]
    monkeypatch.setenv("HF_TOKEN", SECRET)
    try:
        raise ValueError(f"bad header {SECRET} " + "x" * 5000)
    except ValueError as exc:
        record = exit_record("exception", 1, exc)
    assert record["pid"] == os.getpid() and record["exc_type"] == "ValueError"
    assert len(record["message"]) == 2000 and SECRET not in json.dumps(record)
    assert exit_record("returned", 0).keys() == {"pid", "time", "kind", "code"}


def test_the_wrapper_without_an_entrypoint_says_how_to_use_it() -> None:
    with pytest.raises(SystemExit, match="usage: python -m areal_watchdog.rank.main ENTRYPOINT"):
        main([])
