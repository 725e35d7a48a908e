"""The one line a launch's ``--dry-run`` adds when a cheap check the watchdog depends on would
fail (py-spy missing, ptrace refused, a run directory on FUSE): it names ``doctor``, which has
the fixes. Only what answers at once: no process is started, nothing is written."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from areal_watchdog.config.model import JobConfig
from areal_watchdog.doctor.checks.filesystem import (
    existing_ancestor,
    kind_of,
    mount_type,
    parse_mounts,
)
from areal_watchdog.doctor.checks.ptrace import read_policy
from areal_watchdog.doctor.model import FAIL
from areal_watchdog.evidence.pyspy import pyspy_executable
from areal_watchdog.launch.planning.plan import LaunchPlan


def cheap_problems(fileroot: str) -> list[str]:
    """What would fail, in a few words each."""
    problems = []
    if pyspy_executable() is None:
        problems.append("py-spy is not installed")
    policy = read_policy()
    if policy.status == FAIL:
        problems.append(f"ptrace is refused ({policy.detail})")
    try:
        mounts = parse_mounts(Path("/proc/mounts").read_text())
    except OSError:
        mounts = []
    where = existing_ancestor(fileroot).resolve()
    point, fstype = mount_type(str(where), mounts)
    if kind_of(fstype) == "FUSE":
        problems.append(f"the run directory is on FUSE ({fstype} on {point}): FIFOs may be missing")
    return problems


def with_doctor_hint(plan: LaunchPlan, config: JobConfig, watchdog: bool) -> LaunchPlan:
    """``plan`` with one more note when a watched launch would miss evidence here."""
    problems = cheap_problems(config.fileroot) if watchdog else []
    if not problems:
        return plan
    line = (
        f"evidence at risk here: {'; '.join(problems)}: run `areal-launch doctor "
        f"{config.source}` for the fixes"
    )
    return replace(plan, notes=[*plan.notes, line])
