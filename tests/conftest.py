"""Shared test helpers: launch the demo for real and guarantee that nothing outlives a test."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import psutil
import pytest
import yaml

from areal_watchdog.report.build import load_schema
from areal_watchdog.rundir.late_finish import LateFinish
from areal_watchdog.rundir.layout import RunLayout

REPO = Path(__file__).resolve().parents[1]
DEMO_CONFIG = REPO / "examples" / "hang_demo" / "config.yaml"
FAST = [
    "watchdog.stall_timeout=3",
    "watchdog.startup_timeout=20",
    "watchdog.poll_interval=0.25",
    "watchdog.on_hang=cancel",
    "demo.step_time=0.1",
]


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


def sleeper(env: dict[str, str]) -> subprocess.Popen:
    """A Python process that sleeps 60 s with ``env``, returned once it runs with it: right
    after a fork, before the exec, /proc still shows the parent's environment."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
        env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def read_reports(run_dir: Path, folder: str = "incidents") -> list[dict]:
    """Every report.json of a run, oldest first, each validated against the shipped schema."""
    schema = load_schema()
    reports = []
    for path in sorted(run_dir.glob(f"{folder}/*/report.json")):
        report = json.loads(path.read_text())
        jsonschema.validate(report, schema)
        reports.append(report)
    return reports


def timeline_of(report: dict) -> dict:
    """A posted incident's timeline: its data, and the picture drawn beside it (by the sidecar,
    or by its late finish, which ``Launcher.run`` waits for)."""
    folder = Path(report["files"]["incident_dir"])
    assert (folder / "timeline.png").stat().st_size > 0, sorted(p.name for p in folder.iterdir())
    assert "![timeline](timeline.svg)" in (folder / "report.md").read_text()
    return json.loads((folder / "timeline.json").read_text())


def culprit_rows(timeline: dict) -> list[str]:
    return [row["label"] for row in timeline["rows"] if row["culprit"]]


def suspected_looks(run_dir: Path) -> list[dict]:
    """The looks at a silence that were not confirmed: written, not posted, oldest first."""
    return read_reports(run_dir, "suspected")


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


AREAL2_PYTHON = REPO / ".venv-areal2" / "bin" / "python"
HOW_TO_GET_AREAL2 = (
    "AReaL 2.0.0 is not installed beside 1.0.4: put its wheel at "
    "../shared/vendor/areal-2.0.0-py3-none-any.whl and run bash scripts/setup.sh --areal, or "
    "install AReaL from a clone (uv sync) and areal-watchdog into that environment (docs/areal.md)"
)


@pytest.fixture(params=["1.0.4", "2.0.0"])
def areal(request: pytest.FixtureRequest) -> str:
    """The interpreter of the AReaL release under test (its ``launch.python``)."""
    if request.param == "1.0.4":
        return sys.executable
    if not AREAL2_PYTHON.exists():
        pytest.skip(HOW_TO_GET_AREAL2)
    return str(AREAL2_PYTHON)


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    """A Launcher whose processes are all gone after the test, passed or failed."""
    runner = Launcher(tmp_path)
    yield runner
    leftovers = runner.cleanup()
    assert not leftovers, f"processes outlived the test: {leftovers}"


SLOW_AREAL_TIMEOUT = 900  # seconds: a real AReaL run (its replays, its resumes) beside two others


# The Slurm phase's files (``scripts/test.sh``: a file a worker), in the order that ends three
# workers closest together: the two longest first (the eleven Slurm tests, about 320 s; the
# single controller on Slurm, 340 s, whose second test lets its worker take the Ray test next),
# then AReaL's SPMD on Slurm (250 s), the rest after. xdist's own order (most tests first) left
# one worker the SPMD job and all eleven Slurm tests: 604 s where the others ended by 410 s.
LOADFILE_ORDER = ("test_slurm", "test_areal", "test_areal_on_slurm", "test_ray", "test_monitoring")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slurm tests are slow tests too (``-m "not slow"`` skips them); the real AReaL, Ray and
    vLLM runs get a longer time limit than the rest (a loaded CI machine took 2.6x the time
    they take alone); a file a worker, the longest files go out first."""
    if getattr(config.option, "dist", "no") == "loadfile":
        rank = {name: i for i, name in enumerate(LOADFILE_ORDER)}
        items.sort(key=lambda item: rank.get(item.module.__name__, len(rank)))
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("slow") and item.module.__name__.startswith(
            ("test_areal", "test_ray", "test_vllm")
        ):
            item.add_marker(pytest.mark.timeout(SLOW_AREAL_TIMEOUT))


@pytest.fixture(scope="session")
def wheel_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a fresh venv where areal-watchdog is installed from a built wheel.

    The wheel is built with ``python -m build``; the venv sees this venv's third-party packages
    (torch, submitit, ...) through a .pth file, never the source tree."""
    root = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(root), "."],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    (wheel,) = root.glob("areal_watchdog-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    theirs = subprocess.run(
        [sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "borrowed-packages.pth").write_text(theirs + "\n")
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
        check=True,
        capture_output=True,
    )
    return python
