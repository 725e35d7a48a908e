"""Installed from a wheel (not the source tree), areal-launch runs the demo: a real hang, caught,
reported, with the templates and the schema read from inside the installed package."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO
from testkit.launcher import processes_under
from testkit.reports import read_reports

pytestmark = pytest.mark.slow


def test_wheel_install_runs_the_demo(wheel_python: Path, tmp_path: Path) -> None:
    work = tmp_path / "elsewhere"  # not the repository: nothing imports from the source tree
    shutil.copytree(REPO / "examples" / "hang_demo", work)
    where = subprocess.run(
        [str(wheel_python), "-c", "import areal_watchdog; print(areal_watchdog.__file__)"],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(REPO) not in where and "site-packages" in where
    launch = [str(wheel_python), "-m", "areal_watchdog.cli", "--watchdog"]
    overrides = [
        f"cluster.fileroot={tmp_path / 'root'}",
        "launch.nproc_per_node=3",
        "watchdog.stall_timeout=3",
        "demo.step_time=0.1",
    ]
    try:
        result = subprocess.run(
            [*launch, "local", "config.yaml", *overrides],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=150,
        )
        dry = subprocess.run(
            [*launch, "slurm", "config.yaml", *overrides, "--dry-run"],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        for proc in processes_under(tmp_path):
            proc.kill()
    assert result.returncode == 3, result.stdout[-3000:] + result.stderr[-2000:]
    (report,) = read_reports(tmp_path / "root" / "hang-demo" / "collective_mismatch")
    assert report["category"] == "collective_mismatch" and report["culprit_ranks"] == [2]
    assert dry.returncode == 0, dry.stderr
    assert "areal_watchdog.watch.sidecar" in dry.stdout and "srun --overlap" in dry.stdout
