"""A function called ``send``, ``recv``, ``broadcast`` or ``barrier`` is a distributed wait only
when it is torch.distributed's: real py-spy stacks of processes blocked in requests, zmq, asyncio
and the user's own ``broadcast`` (``tests/name_alikes.py``), recorded in
``tests/data/name_alikes/<case>.json`` (``AREAL_RECORD_FIXTURES=1``) and replayed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from recording import DATA, RECORDING

from areal_watchdog.diagnose.classify import classify
from areal_watchdog.diagnose.one_process.activity import describe
from areal_watchdog.evidence.model import BLOCKED, Evidence, RankEvidence
from areal_watchdog.evidence.pyspy import StackError, dump_pyspy, pyspy_executable

SCRIPT = Path(__file__).parent / "name_alikes.py"
RECORDED = DATA / "name_alikes"
# case: (the frame it blocks in, as py-spy names it; where the summary must place the rank)
CASES = {
    "requests": ("HTTPAdapter.send", "block_in_requests()"),
    "zmq": ("Socket.send", "block_in_zmq()"),
    "asyncio": ("BaseSelectorEventLoop.sock_sendall", "_send_all()"),
    "user": ("barrier", "barrier() <- broadcast()"),
}
DISTRIBUTED_KINDS = ("p2p", "collective", "init")
DISTRIBUTED_VERDICTS = ("p2p_mismatch", "collective_mismatch", "collective_stuck")


def blocked_stacks(case: str, frame: str) -> Evidence:
    """Start the case, wait until py-spy sees ``frame`` on a stack, return its evidence."""
    proc = subprocess.Popen([sys.executable, str(SCRIPT), case], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 20
        while True:
            threads = dump_pyspy(proc.pid, timeout=10)
            names = [f.name for t in threads for f in t.frames]
            if frame in names or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert frame in names, names
        rank = RankEvidence(
            rank=0, node="local", pid=proc.pid, local_rank=0, state=BLOCKED,
            evidence_method="py-spy", threads=threads, cpu_utilization=0.0, cwd=str(SCRIPT.parent),
        )  # fmt: skip
        return Evidence(world_size=1, ranks=[rank])
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def assert_not_distributed(evidence: Evidence, where: str) -> None:
    """What a user reads: no distributed wait, and the rank placed at the script's call."""
    activity = describe(evidence.ranks[0])
    assert activity.kind not in DISTRIBUTED_KINDS, activity
    verdict = classify(evidence)
    assert verdict.category not in DISTRIBUTED_VERDICTS, verdict.summary
    assert "point-to-point" not in verdict.summary and where in activity.where, activity.where


@pytest.mark.skipif(pyspy_executable() is None, reason="py-spy is not installed")
@pytest.mark.parametrize("case", CASES)
def test_real_stacks_blocked_in_name_alikes_are_no_distributed_wait(case: str) -> None:
    frame, where = CASES[case]
    try:
        evidence = blocked_stacks(case, frame)
    except StackError as exc:
        pytest.skip(f"py-spy cannot read a child here: {exc}")
    assert_not_distributed(evidence, where)
    if RECORDING:
        RECORDED.mkdir(exist_ok=True)
        (RECORDED / f"{case}.json").write_text(json.dumps(evidence.to_dict(), indent=1))


@pytest.mark.parametrize("case", CASES)
def test_recorded_name_alikes_are_no_distributed_wait(case: str) -> None:
    data = json.loads((RECORDED / f"{case}.json").read_text())
    frame, where = CASES[case]
    evidence = Evidence.from_dict(data)
    assert frame in [f.name for t in evidence.ranks[0].threads for f in t.frames]
    assert_not_distributed(evidence, where)
