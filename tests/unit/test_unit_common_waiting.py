"""Waiting on other processes: looks at a file that grow sparser until a deadline, and a child
that does not outlive the process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from areal_watchdog.common.interprocess import backoff
from areal_watchdog.common.interprocess.backoff import looks


class FakeTime:
    """A clock that only moves when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


def test_looks_grow_sparser_the_last_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeTime()
    monkeypatch.setattr(backoff, "time", clock)
    seen = [round(clock.now - 100.0, 3) for _ in looks(1.0)]
    assert seen == [0.05, 0.15, 0.35, 0.6, 0.85, 1.0]


def test_no_look_when_there_is_nothing_to_wait_for(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeTime()
    monkeypatch.setattr(backoff, "time", clock)
    assert list(looks(0)) == []
    assert clock.now == 100.0


MIDDLE = """
import subprocess, sys, time
from areal_watchdog.common.interprocess.parent import die_with_parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                         preexec_fn=die_with_parent)
print(child.pid, flush=True)
time.sleep(30)
"""


def ended(proc: psutil.Process, within: float) -> bool:
    """Whether ``proc`` exits within ``within`` seconds (a zombie has: its new parent, init,
    may reap it only later)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def test_a_child_dies_with_its_parent_even_by_kill_9() -> None:
    middle = subprocess.Popen([sys.executable, "-c", MIDDLE], stdout=subprocess.PIPE, text=True)
    child: psutil.Process | None = None
    try:
        assert middle.stdout is not None
        child = psutil.Process(int(middle.stdout.readline()))
        os.kill(middle.pid, signal.SIGKILL)
        middle.wait(timeout=5)
        assert ended(child, within=3.0), "the child outlived its parent"
    finally:
        middle.kill()
        middle.wait()
        if child is not None and child.is_running():
            child.kill()
