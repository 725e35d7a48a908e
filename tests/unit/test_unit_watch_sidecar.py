"""The sidecar (``watch.sidecar``) for real, in this process, on a run directory under tmp_path:
its command line refusing a bad run directory, its whole loop on a job that already ended, its
survival of its own errors and of a deleted run directory. What users see: the lines on its
terminal, the final record, its log."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from areal_watchdog.common.atomic import write_json_atomic
from areal_watchdog.config.model import GpuSection, WatchdogSection
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import ENV_NODE
from areal_watchdog.rundir.progress.beats import beat_name
from areal_watchdog.watch.sidecar import Sidecar, main


def launched(run_dir: Path, **watchdog: object) -> LaunchInfo:
    """A run directory as the launcher leaves it: launch.json written."""
    wd = WatchdogSection(
        stall_timeout=30.0, startup_timeout=60.0, poll_interval=0.02,
        gpu=GpuSection(backend="none"), **watchdog,  # type: ignore[arg-type]
    )  # fmt: skip
    info = LaunchInfo(
        run_id="r1", backend="local", run_dir=str(run_dir), world_size=1, nodes=["n1"],
        nproc_per_node=1, experiment_name="e", trial_name="t", fileroot=str(run_dir),
        watchdog=wd,
    )  # fmt: skip
    info.layout.logs_dir.mkdir(parents=True)  # as the launcher makes it
    write_json_atomic(info.layout.launch_file, info.to_dict())
    return info


def said(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


def test_a_bad_run_directory_is_one_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--run-dir", str(tmp_path / "nowhere"), "--node", "n1"]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith("[areal-watchdog] cannot start: ") and "launch.json" in line
    assert captured.out == ""


def test_the_loop_follows_heartbeats_and_records_the_jobs_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rank beat step 5 and its node's job exited with 0: the whole loop, to its end."""
    monkeypatch.setenv(ENV_NODE, "n1")
    info = launched(tmp_path)
    layout = info.layout
    layout.heartbeats("n1").mkdir(parents=True)
    (layout.heartbeats("n1") / beat_name(0, 5, "r1")).touch()
    layout.job_exit_dir.mkdir(parents=True)
    write_json_atomic(layout.job_exit("n1"), {"run_id": "r1", "returncode": 0})
    out = io.StringIO()
    sidecar = Sidecar(info, "n1", ["n1"], out=out)
    assert sidecar.run() == 0
    assert said(out) == [
        "[areal-watchdog n1] watching run r1: 1 ranks on 1 node(s), stall after 30 s "
        "(startup 60 s)",
        "[areal-watchdog n1] first step seen: step 5",
        "[areal-watchdog n1] job completed (last step 5); 0 incident(s)",
    ]
    finished = json.loads(layout.finished_file.read_text())
    assert (finished["run_id"], finished["failed_nodes"], finished["incidents"]) == ("r1", [], [])
    status = json.loads(layout.node_status("n1").read_text())
    assert status["state"] == "finished" and status["last_step"] == 5
    log = (layout.logs_dir / "sidecar_n1.log").read_text()
    assert "job completed (last step 5)" in log


def test_a_deleted_run_directory_is_said_once_and_judged_no_more(tmp_path: Path) -> None:
    info = launched(tmp_path)
    out = io.StringIO()
    sidecar = Sidecar(info, "n1", ["n1"], out=out)
    info.layout.launch_file.unlink()
    for now in (100.0, 101.0, 10_000.0):  # far past any threshold
        sidecar.poll(now)
    (warning,) = said(out)
    assert "WARNING: the run directory" in warning and "will not report or cancel" in warning
    assert not info.layout.cancel_file.exists() and not info.layout.incidents_dir.exists()


def test_the_loop_survives_its_own_errors_and_says_each_once(tmp_path: Path) -> None:
    info = launched(tmp_path)
    out = io.StringIO()
    sidecar = Sidecar(info, "n1", ["n1"], out=out)

    def broken(_now: float) -> None:
        raise KeyError("ranks_alive")

    sidecar.guarded(broken, 1.0)
    sidecar.guarded(broken, 2.0)
    assert said(out) == [
        "[areal-watchdog n1] watchdog error, still watching: KeyError: 'ranks_alive'"
    ]
    log = (info.layout.logs_dir / "sidecar_n1.log").read_text()
    assert "poll failed:" in log and "Traceback" in log
