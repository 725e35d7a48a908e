"""A careless or failing machine: a full disk during a hang, the run directory deleted under a
healthy job, a pathological step pattern. The watchdog must keep its head: the verdict still
reaches the user, a healthy job is never cancelled for our own lost files."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_launcher_lifecycle import wait_for

from conftest import FAST
from testkit.launcher import Launcher, processes_under

pytestmark = pytest.mark.slow


@pytest.fixture
def tiny_root(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB filesystem to fill."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m,mode=1777", "tmpfs", str(mount)],
            capture_output=True,
        ).returncode
    ):
        pytest.skip("needs root to mount a 2 MB tmpfs")
    yield mount
    for proc in processes_under(mount):
        proc.kill()
    subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


def fill(directory: Path, name: str = "filler") -> Path:
    filler = directory / name
    with open(filler, "ab") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass
    return filler


@contextlib.contextmanager
def kept_full(directory: Path) -> Iterator[Path]:
    """Fill ``directory``'s filesystem and keep it full: space that a failed write gives back
    (its temporary file removed) is taken again at once, as on a disk other jobs fill."""
    done = threading.Event()

    def refill() -> None:
        while not done.wait(0.005):
            with contextlib.suppress(OSError):
                fill(directory, "refill")

    filler = fill(directory)
    thread = threading.Thread(target=refill, daemon=True)
    thread.start()
    try:
        yield filler
    finally:
        done.set()
        thread.join()


def test_a_full_disk_during_a_hang_still_gives_the_verdict_and_cancels(
    launcher: Launcher, tiny_root: Path
) -> None:
    (tiny_root / "filler").touch()  # made while there is room: the job may fill 2 MB first
    proc, _ = launcher.start(
        [
            *FAST,
            f"cluster.fileroot={tiny_root}",
            "launch.nproc_per_node=3",
            "demo.hang=collective_mismatch",
            "demo.hang_step=4",
        ]
    )
    wait_for(proc, "Train step 3")
    with kept_full(tiny_root) as filler:
        seen = wait_for(proc, "verdict (report not on disk yet", timeout=60)
        assert "Traceback" not in seen
        assert "collective_mismatch, culprit ranks 2" in seen.splitlines()[-1]
        # on_hang=cancel needs no disk: the job ends while the disk is still full
        output, _ = proc.communicate(timeout=90)
    assert proc.returncode == 3, output[-3000:]
    assert "terminating the job" in seen + output, seen + output
    assert filler.exists()


def remove_while_written(path: Path) -> None:
    """``rm -rf`` a directory that live processes keep writing to: a file that vanishes under
    the walk (an atomic write's temporary renamed away) is no error; walk again until it is gone."""
    deadline = time.time() + 10
    while path.exists() and time.time() < deadline:
        shutil.rmtree(path, ignore_errors=True)
    assert not path.exists(), f"{path} kept coming back"


def test_deleting_the_run_directory_never_cancels_a_healthy_job(launcher: Launcher) -> None:
    proc, run_dir = launcher.start(
        [*FAST, "launch.nproc_per_node=2", "demo.hang=none", "demo.steps=60"]
    )
    wait_for(proc, "first step seen")
    remove_while_written(run_dir)
    output, _ = proc.communicate(timeout=120)
    assert "WARNING: the run directory" in output and "is gone" in output
    assert "Training completes!" in output
    assert proc.returncode == 0, output[-3000:]
    assert "report written" not in output and "on_hang=cancel" not in output
    time.sleep(0.5)
    assert not processes_under(launcher.root)
