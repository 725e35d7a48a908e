"""AReaL's SPMD mode on a real Slurm cluster in a loopback-only network namespace, a file of its
own so that the suite's Slurm phase runs it beside the single controller's Slurm test
(``tests/test_areal.py``) and the other Slurm tests, a worker each: its cluster is its own."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from test_areal import RECOVER, RESUME, harness, loopback_slurm, needs_areal, needs_root, run_areal

from testkit.launcher import Launcher

__all__ = ["harness", "loopback_slurm"]  # fixtures this module uses, made here anew


@needs_areal
@needs_root
@pytest.mark.slurm
@pytest.mark.parametrize("areal", ["1.0.4"], indirect=True)  # 2.0.0: + a post-exit hook
def test_spmd_on_slurm_one_job_a_wedged_server_named_and_resumed_without_its_node(
    launcher: Launcher, harness: Path, areal: str, loopback_slurm: tuple[list[str], dict]
) -> None:
    """SPMD on Slurm in one job: node1 runs AReaL's server launcher, node2 waits for the
    registration, then torchrun. The server wedges (once); the report names it on node1. With
    ``on_hang: resume``, the dumped step replays on a node other than node1 without hanging, so
    the job is submitted again without node1 and completes from AReaL's recover checkpoint."""
    enter, env = loopback_slurm
    result = run_areal(
        launcher, harness, "spmdslurm", python=areal, timeout=720,
        overrides=["launch.mode=spmd", "cluster.n_nodes=2", *RECOVER, *RESUME,
                   "total_train_steps=3", "+launch.env.AREAL_STANDIN_WEDGE_AFTER=6",
                   f"+launch.env.AREAL_STANDIN_WEDGE_ONCE={launcher.root / 'wedged'}",
                   "+launch.slurm.mem=3G", "--wait"],
        backend="slurm", prefix=enter, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.output[-4000:]
    (report,) = result.reports
    assert (report["category"], report["cause"]) == ("rollout_stalled", "inference_wedged")
    (culprit,) = report["culprit_workers"]
    assert (culprit["role"], culprit["node"]) == ("inference_server", "node1")
    assert report["ranks"][0]["node"] == "node2"
    assert report["culprit_nodes"] == ["node1"]
    recovery = report["recovery"]
    assert recovery["decision"] == "resume" and recovery["nodes_excluded"] == ["node1"]
    (replayed,) = recovery["replays"]
    assert (replayed["hung"], replayed["exit_code"]) == (False, 0), recovery
    watched = [p.stem for p in (Path(replayed["run_dir"]) / "watchdog" / "status").glob("*.json")]
    assert len(watched) == 1 and watched != ["node1"], watched  # the replay's own node
    assert "after 1 resume(s) the job completed" in result.output
    resumed = json.loads((result.run_dir / "watchdog" / "slurm_job.json").read_text())["job_id"]
    shown = subprocess.run([*enter, "scontrol", "show", "job", "-o", resumed], env=env,
                           capture_output=True, text=True).stdout  # fmt: skip
    assert re.search(r" NodeList=node\[?[2-4]", shown) and "ExcNodeList=node1" in shown, shown
    submitit = result.run_dir / "watchdog" / "logs" / "submitit"
    logs = [p.read_text(errors="replace") for p in submitit.glob(f"{resumed}_*_log.out")]
    assert any("Recovering from StepInfo(" in log for log in logs)
    jobs = subprocess.run([*enter, "squeue", "-h"], env=env, capture_output=True, text=True)
    assert jobs.stdout.strip() == ""
