"""The schedulers' clients on the launching node: Slurm's ``sinfo``/``srun`` and Ray's Python
package (what the ``slurm`` and ``ray`` backends call). Absent is a warning: a job on another
backend needs neither."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import subprocess

from areal_watchdog.doctor.model import PASS, WARN, Check


def check_slurm() -> Check:
    sinfo, srun = shutil.which("sinfo"), shutil.which("srun")
    if not sinfo or not srun:
        missing = " and ".join(n for n, p in (("sinfo", sinfo), ("srun", srun)) if not p)
        return Check(
            "slurm client",
            WARN,
            f"{missing} not on PATH",
            "for the slurm backend: install Slurm's client or load its module",
        )
    try:
        out = subprocess.run([sinfo, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return Check("slurm client", WARN, f"sinfo --version: {exc}", "check Slurm's client")
    if out.returncode != 0:
        why = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1][:160]
        return Check(
            "slurm client",
            WARN,
            f"sinfo --version: {why}",
            "point SLURM_CONF at the cluster's slurm.conf (or run on a login node)",
        )
    version = out.stdout.strip().splitlines()[0] if out.stdout.strip() else "version unknown"
    return Check("slurm client", PASS, f"{version}; srun at {srun}")


def check_ray() -> Check:
    """Ray's package as the launcher imports it (its metadata: importing Ray takes seconds)."""
    if importlib.util.find_spec("ray") is None:
        return Check(
            "ray client",
            WARN,
            "ray is not installed",
            "needed for the ray backend: pip install 'ray[default]'",
        )
    try:
        version = importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        version = "version unknown"
    return Check("ray client", PASS, f"ray {version}")
