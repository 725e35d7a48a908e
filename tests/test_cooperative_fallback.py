"""Ranks py-spy may not attach to still get stacks, through the rank's own faulthandler.

The sidecar runs without CAP_SYS_PTRACE (as in a container without SYS_PTRACE): the kernel then
refuses ptrace on the ranks, whose capabilities exceed the sidecar's, exactly as Yama or a
different user would. Signals still reach them, so the cooperative dump answers.
"""

from __future__ import annotations

import dataclasses
import io
import os
import shutil

import pytest

from areal_watchdog.config.load import load_config
from areal_watchdog.launch.exit_codes import ExitCode
from areal_watchdog.launch.local import LocalBackend
from conftest import FAST
from testkit.launcher import DEMO_CONFIG, Launcher
from testkit.reports import read_reports

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("setpriv"),
        reason="needs root and util-linux's setpriv to drop CAP_SYS_PTRACE",
    ),
]


def test_stacks_without_ptrace_come_from_faulthandler(launcher: Launcher) -> None:
    config = load_config(
        DEMO_CONFIG,
        [
            *FAST,
            f"cluster.fileroot={launcher.root}",
            "trial_name=coop",
            "launch.nproc_per_node=3",
            "demo.hang=collective_mismatch",
            "demo.hang_rank=1",
            "demo.hang_step=2",
        ],
    )
    plan = LocalBackend().plan(config, watchdog=True)
    job, sidecar = plan.processes
    unprivileged = dataclasses.replace(
        sidecar, argv=["setpriv", "--bounding-set", "-sys_ptrace", *sidecar.argv]
    )
    plan = dataclasses.replace(plan, processes=[job, unprivileged])
    out = io.StringIO()
    code = LocalBackend().execute(plan, out)
    assert code == ExitCode.HANG_CANCELLED, out.getvalue()[-3000:]
    (report,) = read_reports(config.run_dir)
    assert report["category"] == "collective_mismatch"
    assert report["culprit_ranks"] == [1]
    assert {r["evidence_method"] for r in report["ranks"]} == {"faulthandler"}
    stacks = config.run_dir / "incidents" / report["incident_id"] / "stacks" / "rank_1.txt"
    assert "via faulthandler" in stacks.read_text()
