"""The real two-node Slurm cluster for the tests: brought up by scripts/slurm-cluster.sh."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm-cluster.sh"
CONF = Path(os.environ.get("AREAL_SLURM_DIR", "/tmp/areal-slurm")) / "slurm.conf"
HOW = (
    "needs a real Slurm: run as root with apt-get available (the tests install Debian's "
    "slurm-wlm and munge), or install them and run `bash scripts/slurm-cluster.sh up`"
)


def cluster_is_up() -> bool:
    if not CONF.exists() or shutil.which("sinfo") is None:
        return False
    out = subprocess.run(
        ["sinfo", "-h", "-o", "%T"],
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_CONF": str(CONF)},
        check=False,
    )
    return out.returncode == 0 and set(out.stdout.split()) == {"idle"}


def bring_up() -> bool:
    """Start the cluster if it is not running; True when this call started it."""
    if cluster_is_up():
        return False
    if shutil.which("slurmctld") is None and (os.geteuid() != 0 or not shutil.which("apt-get")):
        pytest.skip(HOW)
    out = subprocess.run(
        ["bash", str(SCRIPT), "up"], capture_output=True, text=True, check=False, timeout=900
    )
    if out.returncode != 0:
        pytest.skip(f"{HOW}; bring-up failed: {out.stderr.strip()[-500:]}")
    return True


def tear_down() -> None:
    subprocess.run(["bash", str(SCRIPT), "down"], capture_output=True, check=False, timeout=120)


def slurm_env() -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": str(CONF)}


def job_processes(job_id: str, node: str | None = None) -> list[psutil.Process]:
    """The Python processes of a job's steps (sidecars, submitit tasks, torchrun, ranks)."""
    found = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if env.get("SLURM_JOB_ID") != job_id or "python" not in " ".join(proc.cmdline()):
                continue
            if node is None or env.get("SLURMD_NODENAME") == node:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def wait_until(predicate, timeout: float, poll: float = 0.25) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return predicate()
