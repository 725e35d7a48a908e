"""The flagship demo end to end: a data-dependent hang in a real RL loop, caught, then reproduced
on one node from the dump with no rollout at all; a healthy replay reproduces the losses."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from testkit.launcher import Launcher
from testkit.reports import read_reports

pytestmark = pytest.mark.slow

RL_CONFIG = REPO / "examples" / "rl_demo" / "config.yaml"
FAST = ["watchdog.stall_timeout=3", "watchdog.poll_interval=0.25", "watchdog.on_hang=cancel"]
LOSS = re.compile(r"Train step (\d+)/\d+ done\. loss=(-?[\d.]+)")


def replay(launcher: Launcher, run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(
        [sys.executable, "-m", "areal_watchdog.cli", "replay", str(run_dir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        cwd=REPO,
    )
    launcher.popens.append(proc)
    output, _ = proc.communicate(timeout=150)
    return subprocess.CompletedProcess(proc.args, proc.returncode, output)


def test_hang_is_caught_replayed_and_healthy_losses_match(launcher: Launcher) -> None:
    original = launcher.run(
        [*FAST, "launch.nproc_per_node=4", "data.long_prompt_step=4", "data.long_prompt_rank=1"],
        config=RL_CONFIG,
        trial="rl",
    )
    run_dir = launcher.root / "rl-demo" / "rl"
    reports = read_reports(run_dir)
    assert original.returncode == 3, original.output[-3000:]
    (report,) = reports
    assert report["category"] == "collective_mismatch" and report["culprit_ranks"] == [1]
    assert report["trajectory"]["step"] == 4
    assert report["trajectory"]["replay_command"] == f"areal-launch replay {run_dir} --step 4"
    assert "rollout engine started" in original.output
    losses = {int(s): v for s, v in LOSS.findall(original.output)}
    assert sorted(losses) == [1, 2, 3]
    # one meaning of "step": the last completed one, on the terminal and in the report
    assert report["last_step"] == 3
    seen = re.findall(r"first step seen: step (\d+)", original.output)
    assert seen and all(int(s) <= 3 for s in seen), seen

    # 1. the default replay reproduces the very same hang, without any rollout
    again = replay(launcher, run_dir, *[f"++{o}" for o in FAST])
    assert again.returncode == 3, again.stdout[-3000:]
    (replayed,) = read_reports(launcher.root / "rl-demo" / "rl_replay4")
    assert replayed["category"] == "collective_mismatch" and replayed["culprit_ranks"] == [1]
    assert "rollout engine disabled: replaying steps [4]" in again.stdout
    assert "rollout engine started" not in again.stdout
    assert read_reports(run_dir) == reports  # the original run is untouched

    # 2. a healthy range replays to the end with the original losses
    healthy = replay(launcher, run_dir, "--from", "2", "--to", "3")
    assert healthy.returncode == 0, healthy.stdout[-3000:]
    replayed_losses = {int(s): float(v) for s, v in LOSS.findall(healthy.stdout)}
    assert sorted(replayed_losses) == [2, 3]
    assert replayed_losses[2] == float(losses[2])  # same weights, same batch: bit for bit
    # Later steps agree to float32 rounding: DDP rebuilds its gradient buckets after its first
    # iteration, which is step 1 in the original and step 2 in the replay, so the all_reduce
    # sums in another order.
    assert replayed_losses[3] == pytest.approx(float(losses[3]), rel=1e-5)
    assert (launcher.root / "rl-demo" / "rl_replay2to3" / "checkpoints" / "step_3.pt").exists()
