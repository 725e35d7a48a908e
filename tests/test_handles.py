"""``areal-launch status`` and ``cancel`` by handle, as torchx names an app: ``local://RUN_DIR``,
``slurm://JOB_ID``, ``ray://RUN_DIR``, or a bare run directory (the backend that launched it
answers). A local cancel ends every process of the run; the run directory stays."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from ray import __version__ as ray_version

from areal_watchdog.cli import main
from areal_watchdog.common.atomic import write_json_atomic
from areal_watchdog.config.model import WatchdogSection
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import ENV_RUN_ID, RunLayout
from conftest import sleeper


class JobsApi(ThreadingHTTPServer):
    """The part of Ray's Jobs API (its dashboard's HTTP) that ``JobSubmissionClient`` calls to
    read a job's state and stop it, on loopback: what was asked is kept in ``asked``."""

    def __init__(self, state: str) -> None:
        super().__init__(("127.0.0.1", 0), _JobsHandler)
        self.state, self.asked = state, []
        self.address = f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> JobsApi:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.shutdown()
        self.server_close()


class _JobsHandler(BaseHTTPRequestHandler):
    server: JobsApi

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.asked.append(f"GET {self.path}")
        submission = self.path.rsplit("/", 1)[1]
        body = {"ray_version": ray_version, "version": "4", "session_name": "s"}
        if self.path.startswith("/api/jobs/"):
            body = {"type": "SUBMISSION", "submission_id": submission,
                    "status": self.server.state, "entrypoint": "python -m driver"}  # fmt: skip
        self._answer(body)

    def do_POST(self) -> None:  # noqa: N802
        self.server.asked.append(f"POST {self.path}")
        self._answer({"stopped": self.server.state == "RUNNING"})

    def _answer(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: object) -> None:
        """Quiet."""


def launched(tmp_path: Path, backend: str, **recorded: str) -> Path:
    """A run directory as a launch on ``backend`` leaves it."""
    run_dir = tmp_path / "exp" / "t"
    RunLayout(run_dir).watch_dir.mkdir(parents=True, mode=0o700)
    info = LaunchInfo(
        run_id="run-h1", backend=backend, run_dir=str(run_dir), world_size=1, nodes=["n1"],
        nproc_per_node=1, experiment_name="exp", trial_name="t", fileroot=str(tmp_path),
        watchdog=WatchdogSection(), **recorded,
    )  # fmt: skip
    write_json_atomic(RunLayout(run_dir).launch_file, info.to_dict())
    return run_dir


def test_a_local_run_is_shown_and_ended_by_its_handle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = launched(tmp_path, "local")
    env = {**os.environ, ENV_RUN_ID: "run-h1"}
    rank = sleeper(env)
    try:
        assert main(["status", f"local://{run_dir}"]) == 0
        assert f"run dir: {run_dir} (local run, no Slurm job)" in capsys.readouterr().out
        assert main(["status", str(run_dir)]) == 0  # bare: launch.json names the backend
        assert "(local run, no Slurm job)" in capsys.readouterr().out
        assert main(["cancel", f"local://{run_dir}"]) == 0
        said = capsys.readouterr().out.strip()
        assert said == f"[areal-launch] ended 1 process(es) of run run-h1; run dir kept: {run_dir}"
        assert rank.wait(timeout=10) == -9
        assert main(["cancel", str(run_dir)]) == 0
        assert "no process of it is running" in capsys.readouterr().out
    finally:
        if psutil.pid_exists(rank.pid):
            rank.kill()
        rank.wait()
    assert run_dir.is_dir()


def test_a_handle_names_a_backend_that_exists_and_can_do_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = launched(tmp_path, "ray")
    assert main(["status", str(run_dir)]) == 0
    assert f"run dir: {run_dir} (Ray run)" in capsys.readouterr().out
    assert main(["cancel", f"ray://{run_dir}"]) == 0  # no Ray job recorded: its processes
    assert "run run-h1: no process of it is running" in capsys.readouterr().out
    assert main(["status", f"pbs://{run_dir}"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "areal-launch: error: no backend named 'pbs' (installed: local, slurm, ray)"
    assert main(["cancel", f"local://{tmp_path / 'nothing'}"]) == 2
    assert "no such run directory" in capsys.readouterr().err
    assert main(["status", str(tmp_path / "typo")]) == 2  # no directory, and no backend's job id
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith("typo: neither a run directory nor a job id of a backend")
    assert main(["status", str(tmp_path)]) == 0  # a directory no launch.json names a backend of
    assert "(no backend named in watchdog/launch.json)" in capsys.readouterr().out


def test_a_ray_run_is_shown_and_stopped_through_its_jobs_api(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its launch.json names the submission and the Jobs API: ``status`` asks its state,
    ``cancel`` asks Ray to stop it (the launcher then sees it STOPPED and ends)."""
    job = "areal-watchdog-run-h1"
    with JobsApi("RUNNING") as api:
        run_dir = launched(tmp_path, "ray", job_id=job, job_address=api.address)
        assert main(["status", f"ray://{run_dir}"]) == 0
        assert f"Ray job {job} at {api.address}: RUNNING" in capsys.readouterr().out
        assert main(["cancel", str(run_dir)]) == 0
        said = capsys.readouterr().out.strip()
        assert said == f"[areal-launch] asked Ray at {api.address} to stop job {job}; " \
            f"run dir kept: {run_dir}"  # fmt: skip
        assert f"POST /api/jobs/{job}/stop" in api.asked
    # its own cluster ended with its launcher: the Jobs API no longer answers
    assert main(["status", f"ray://{run_dir}"]) == 0
    assert "UNKNOWN (the Jobs API does not answer" in capsys.readouterr().out
    assert main(["cancel", f"ray://{run_dir}"]) == 0
    assert "run run-h1: no process of it is running" in capsys.readouterr().out


def test_a_handle_splits_only_at_a_scheme(tmp_path: Path) -> None:
    from areal_watchdog.launch.run_handle import launched_by, split_handle
    from areal_watchdog.launch.slurm.control import handle as slurm_handle

    assert split_handle("slurm://123") == ("slurm", "123")
    assert split_handle("local:///tmp/run") == ("local", "/tmp/run")
    assert split_handle("/tmp/a://b") == (None, "/tmp/a://b")  # a path, not a scheme
    run_dir = launched(tmp_path, "slurm")
    assert launched_by(run_dir) == "slurm"
    assert not slurm_handle.recognises(run_dir)  # an AReaL controller on Slurm submits no job
    write_json_atomic(RunLayout(run_dir).slurm_job_file, {"job_id": "41"})
    assert slurm_handle.recognises(run_dir)
