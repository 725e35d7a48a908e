"""``areal-launch`` run for real on the hang demo, in a session of its own, and everything it
started killed at the end: what a user sees, and nothing left behind to slow the next run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import yaml

from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.sidecar_files.late_finish import LateFinish
from testkit.reports import read_reports

REPO = Path(__file__).resolve().parents[1]
DEMO_CONFIG = REPO / "examples" / "hang_demo" / "config.yaml"


@dataclass
class LaunchResult:
    """What a user sees after one ``areal-launch`` run."""

    returncode: int
    output: str
    run_dir: Path
    reports: list[dict] = field(default_factory=list)


def processes_under(root: Path) -> list[psutil.Process]:
    """Processes whose watchdog directory (or command line) lies below ``root``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid():
                continue
            env_dir = proc.environ().get("AREAL_WATCHDOG_DIR", "")
            if env_dir.startswith(str(root)) or any(str(root) in a for a in proc.cmdline()):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def gone_within(root: Path, seconds: float) -> list[psutil.Process]:
    """The processes under ``root`` still alive after up to ``seconds`` (none: all ended)."""
    deadline = time.monotonic() + seconds
    while True:
        left = []
        for proc in processes_under(root):
            with contextlib.suppress(psutil.Error):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(proc)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.25)


def await_late_finishes(run_dir: Path, timeout: float = 150.0) -> None:
    """Until the late finishes the run's sidecars left have ended (their pictures and sends)."""
    layout = RunLayout(run_dir)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = LateFinish.read_all(layout)
        running = [r for r in records if r.running() and psutil.pid_exists(r.pid)]
        if not running:
            for record in records:  # its last moment: the record written, then the exit
                with contextlib.suppress(psutil.Error):
                    psutil.Process(record.pid).wait(5)
            return
        time.sleep(0.2)


class Launcher:
    """Runs ``areal-launch`` in a session of its own and kills everything at teardown."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.popens: list[subprocess.Popen] = []

    def start(
        self,
        overrides: list[str],
        *,
        trial: str = "t",
        config: Path = DEMO_CONFIG,
        args: tuple[str, ...] = ("--watchdog",),
        backend: str = "local",
        env: dict[str, str] | None = None,
        prefix: list[str] | tuple[str, ...] = (),
    ) -> tuple[subprocess.Popen, Path]:
        """Start ``areal-launch`` (after ``prefix``, a wrapper command) and return it with the
        run directory it will use."""
        cmd = [
            *prefix,
            sys.executable,
            "-m",
            "areal_watchdog.cli",
            *args,
            backend,
            str(config),
            f"cluster.fileroot={self.root}",
            f"trial_name={trial}",
            *overrides,
        ]
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            cwd=REPO,
            env={**os.environ, **(env or {})},
        )
        self.popens.append(proc)
        experiment = yaml.safe_load(config.read_text()).get("experiment_name", "hang-demo")
        for override in overrides:
            if override.startswith("experiment_name="):
                experiment = override.split("=", 1)[1]
        return proc, self.root / experiment / trial

    def run(self, overrides: list[str], *, timeout: float = 150, **kwargs: object) -> LaunchResult:
        """Run ``areal-launch`` to its end."""
        proc, run_dir = self.start(overrides, **kwargs)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.cleanup()
            output, _ = proc.communicate()
            pytest.fail(f"areal-launch did not finish within {timeout} s:\n{output[-4000:]}")
        await_late_finishes(run_dir)
        return LaunchResult(proc.returncode, output, run_dir, read_reports(run_dir))

    def cleanup(self) -> list[str]:
        """Kill every process this launcher started; return those still alive (pid, command).
        A sidecar's late finish (bounded, detached on purpose) is waited for first."""
        for late in self.root.glob("**/watchdog/late_finish"):
            await_late_finishes(late.parent.parent)
        leftovers = []
        for proc in self.popens:
            if proc.poll() is None:
                leftovers.append(f"{proc.pid} {proc.args}")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for proc in processes_under(self.root):
            with contextlib.suppress(psutil.Error):
                leftovers.append(f"{proc.pid} {' '.join(proc.cmdline())[:300]}")
                proc.kill()
        return leftovers
