"""The sidecar's request to end a hung job, as the launcher and a scheduler receive it: one
typed record on disk and on the launcher's pipe, and the backend's recorded command that a
sidecar runs where no launcher can be asked. No real job: a tiny scheduler script stands in for
Slurm's (``launch.slurm.scheduler_command`` speaks the same verbs, tested on a real Slurm in
test_slurm.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from areal_watchdog.config.model import HangAction, WatchdogSection
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import ENV_CANCEL_FD, RunLayout
from areal_watchdog.rundir.sidecar_files.hang_request import HangRequest
from areal_watchdog.watch.cluster.scheduler import end_job, end_orphans, placement

SCHEDULER = """
import json, sys
verb, run_dir, *rest = sys.argv[1:]
with open(run_dir + "/scheduler.log", "a") as log:
    log.write(" ".join([verb, *rest]) + "\\n")
if verb == "where":
    print(json.dumps({"node": "n2", "nodes": ["n1", "n2"], "job_id": "77"}))
elif verb == "end-job":
    print(f"ended job {rest[0]} ({rest[1]})")
else:
    sys.exit("no such verb")
"""


def info(run_dir: Path, command: list[str] | None, on_hang: str = "cancel") -> LaunchInfo:
    """A launch's record, written as the launcher writes it (the sidecar trusts no other)."""
    launched = LaunchInfo(
        run_id="r1", backend="example", run_dir=str(run_dir), world_size=2, nodes=["n1", "n2"],
        nproc_per_node=1, experiment_name="e", trial_name="t", fileroot=str(run_dir),
        watchdog=WatchdogSection(on_hang=on_hang), scheduler_command=command,
    )  # fmt: skip
    launched.layout.watch_dir.mkdir(parents=True, exist_ok=True)
    launched.layout.launch_file.write_text("{}")
    launched.layout.launch_file.chmod(0o600)
    return launched


def test_the_request_reads_back_the_same_from_disk_and_from_the_pipe(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    layout.watch_dir.mkdir(parents=True)
    request = HangRequest("r1", "20261127T000000Z-straggler-ab12", HangAction.RESUME, 1.5)
    request.write(layout)
    assert HangRequest.read(layout) == request
    read, write = os.pipe()
    try:
        os.environ[ENV_CANCEL_FD] = str(write)
        assert request.send_to_launcher()
        assert HangRequest.heard(os.read(read, 4096).decode() + "noise\n") == [request]
    finally:
        del os.environ[ENV_CANCEL_FD]
        os.close(read), os.close(write)
    assert not request.send_to_launcher()  # a Slurm or Ray sidecar has no pipe
    layout.cancel_file.write_text('{"run_id": "r1", "incid')  # torn by a crash
    assert HangRequest.read(layout) is None


def test_on_hang_is_one_typed_value_from_yaml_to_launch_json() -> None:
    section = WatchdogSection(on_hang="resume")  # as launch.json gives it back
    assert section.on_hang is HangAction.RESUME and section.on_hang.ends_job
    assert f"on_hang={section.on_hang}" == "on_hang=resume"
    assert not HangAction.REPORT.ends_job
    with pytest.raises(ValueError):
        WatchdogSection(on_hang="restart")


def test_a_sidecar_acts_on_the_scheduler_only_through_the_recorded_command(
    tmp_path: Path,
) -> None:
    script = tmp_path / "scheduler.py"
    script.write_text(SCHEDULER)
    run = info(tmp_path, [sys.executable, str(script)])
    placed = placement(run)
    assert (placed.node, placed.nodes, placed.job_id) == ("n2", ["n1", "n2"], "77")
    assert end_job(run, "77", HangAction.CANCEL) == "ended job 77 (cancel)"
    assert end_orphans(run) == "no such verb"  # the scheduler's own words reach the log
    assert (tmp_path / "scheduler.log").read_text().splitlines() == [
        "where", "end-job 77 cancel", "orphaned",
    ]  # fmt: skip
    run.layout.launch_file.chmod(0o620)  # another member of the group could have written it
    assert end_job(run, "77", HangAction.CANCEL).startswith("end-job refused: ")
    run.layout.launch_file.chmod(0o600)
    if os.geteuid() == 0:  # a record another user planted: never run
        os.chown(run.layout.launch_file, 65534, 65534)
        assert "owned by uid 65534" in end_job(run, "77", HangAction.CANCEL)
        os.chown(run.layout.launch_file, 0, 0)
    planted = tmp_path / "planted.json"
    planted.write_text("{}")
    run.layout.launch_file.unlink()
    run.layout.launch_file.symlink_to(planted)  # a link, wherever it points: never run
    assert end_job(run, "77", HangAction.CANCEL).startswith("end-job refused: ")
    assert (tmp_path / "scheduler.log").read_text().count("end-job") == 1  # it never ran
    local = info(tmp_path, None)
    assert end_orphans(local) == ""  # a local launch: the launcher ends what is left
    with pytest.raises(RuntimeError, match="no scheduler command"):
        placement(local)
