"""The run's processes and the run's mask, read from what the launcher left: every process that
carries the run id is ended at the end of a run (and no other), and the secrets the run knows
are printed as ``***`` by every process of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from areal_watchdog.common.secrets.mask import ENV_MASKED
from areal_watchdog.config.model import WatchdogSection
from areal_watchdog.config.sinks import parse_sinks
from areal_watchdog.rundir.job_mask import job_mask
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import ENV_RUN_ID, RunLayout
from areal_watchdog.rundir.run_processes import kill_run_processes, run_processes
from conftest import sleeper

SLEEPER = [sys.executable, "-c", "import time; time.sleep(30)"]


def start(run_id: str) -> subprocess.Popen[bytes]:
    return sleeper({**os.environ, ENV_RUN_ID: run_id})


def test_the_end_of_a_run_kills_its_processes_and_no_others() -> None:
    ours, other = f"run-{uuid.uuid4().hex}", f"run-{uuid.uuid4().hex}"
    mine, neighbour = start(ours), start(other)
    try:
        assert [p.pid for p in run_processes(ours)] == [mine.pid]
        assert kill_run_processes(ours) == [mine.pid]
        assert mine.wait(timeout=5) == -9
        assert neighbour.poll() is None  # another run's process is left alone
        assert run_processes(ours) == []
    finally:
        for proc in (mine, neighbour):
            proc.kill()
            proc.wait()


def launched(run_dir: Path, notify: list[dict]) -> RunLayout:
    layout = RunLayout(run_dir)
    layout.watch_dir.mkdir(parents=True)
    info = LaunchInfo(
        run_id="r1", backend="local", run_dir=str(run_dir), world_size=1, nodes=["n1"],
        nproc_per_node=1, experiment_name="e", trial_name="t", fileroot=str(run_dir),
        watchdog=WatchdogSection(notify=notify),
    )  # fmt: skip
    layout.launch_file.write_text(json.dumps(info.to_dict()))
    return layout


def test_the_run_masks_its_named_variables_and_its_notify_secrets(tmp_path: Path) -> None:
    url = tmp_path / "hook.url"
    url.write_text("https://hooks.example.com/services/T0SECRET?sig=abcdef123\n")
    url.chmod(0o600)
    sinks = parse_sinks([{"type": "webhook", "url_file": str(url)}], "job.yaml")
    layout = launched(tmp_path / "run", [s.to_dict() for s in sinks])
    env = {ENV_MASKED: "WANDB_API_KEY,SHORT,UNSET", "WANDB_API_KEY": "wandb-0123456", "SHORT": "1"}
    mask = job_mask(layout, env)
    assert mask("key=wandb-0123456 steps=1") == "key=*** steps=1"  # "1" is too short to mask
    assert mask("posting to https://hooks.example.com/services/T0SECRET?sig=abcdef123") == (
        "posting to ***"
    )
    assert mask("GET /services/T0SECRET?sig=abcdef123") == "GET ***?***"
