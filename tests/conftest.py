"""Shared test helpers: a launcher that guarantees nothing outlives a test, the AReaL releases
under test, a venv with the built wheel (what the benchmarks share with the tests is in
``testkit/``)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.launcher import Launcher

REPO = Path(__file__).resolve().parents[1]
FAST = [
    "watchdog.stall_timeout=3",
    "watchdog.startup_timeout=20",
    "watchdog.poll_interval=0.25",
    "watchdog.on_hang=cancel",
    "demo.step_time=0.1",
]


def sleeper(env: dict[str, str]) -> subprocess.Popen:
    """A Python process that sleeps 60 s with ``env``, returned once it runs with it: right
    after a fork, before the exec, /proc still shows the parent's environment."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
        env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def timeline_of(report: dict) -> dict:
    """A posted incident's timeline: its data, and the picture drawn beside it (by the sidecar,
    or by its late finish, which ``Launcher.run`` waits for)."""
    folder = Path(report["files"]["incident_dir"])
    assert (folder / "timeline.png").stat().st_size > 0, sorted(p.name for p in folder.iterdir())
    assert "![timeline](timeline.svg)" in (folder / "report.md").read_text()
    return json.loads((folder / "timeline.json").read_text())


def culprit_rows(timeline: dict) -> list[str]:
    return [row["label"] for row in timeline["rows"] if row["culprit"]]


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slurm tests are slow tests too (``-m "not slow"`` skips them); the real AReaL, Ray and
    vLLM runs get a longer time limit than the rest (a loaded CI machine took 2.6x the time
    they take alone)."""
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
