"""The Ray backend without a Ray cluster: the plan on an existing cluster's Jobs API (what the
submission carries, what the dry run says), the refusal of ``on_hang: resume``, the driver's
exit code as the Jobs API reports it, how a run ends (``RayRun.exit_code``, the exits it
records, the log lines it forwards) and the guardian's clean-up of only this run's processes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from areal_watchdog.common.errors import UserError
from areal_watchdog.config.load import load_config
from areal_watchdog.config.model import HangAction
from areal_watchdog.launch.exit_codes import ExitCode
from areal_watchdog.launch.ray.backend import RayBackend
from areal_watchdog.launch.ray.guardian import end_the_run
from areal_watchdog.launch.ray.jobs import job_returncode
from areal_watchdog.launch.ray.run import LogTails, RayRun
from areal_watchdog.launch.ray.submission import RaySubmission
from areal_watchdog.recover.checks import check_resumable
from areal_watchdog.rundir.layout import ENV_RUN_ID, RunLayout
from areal_watchdog.rundir.sidecar_files.hang_request import HangRequest
from conftest import REPO, sleeper

AREAL = REPO / "examples" / "areal" / "gsm8k_grpo.yaml"
HEAD = "http://10.1.2.3:8265"


def ray_plan(tmp_path: Path, *overrides: str, watchdog: bool = True):
    config = load_config(AREAL, [f"cluster.fileroot={tmp_path}", *overrides])
    return config, RayBackend().plan(config, watchdog, run_id="r5")


def test_on_an_existing_cluster_the_plan_submits_to_its_jobs_api_and_starts_no_raylet(
    tmp_path: Path,
) -> None:
    _, plan = ray_plan(tmp_path, "launch.mode=spmd", f"+launch.ray.address={HEAD}")
    assert plan.payload == RaySubmission(HEAD, None, "areal-watchdog-r5", plan.main().argv[0])
    assert plan.of_kind("cluster") == [] and [p.kind for p in plan.processes] == ["job", "watchdog"]
    driver = plan.main().argv
    assert driver[1:3] == ["-m", "areal_watchdog.launch.ray.driver"] and "--unwatched" not in driver
    assert driver[driver.index("--") + 1 :][1:3] == ["-m", "areal.infra.launcher.ray"]
    assert plan.main().env[ENV_RUN_ID] == "r5"  # the runtime_env every Ray worker gets
    assert plan.notes[0].startswith(f"submitted to the Ray cluster at {HEAD} as Ray job "
                                    "areal-watchdog-r5")  # fmt: skip
    assert not Path(plan.run_dir).exists()


def test_an_unwatched_ray_plan_has_no_sidecar_and_tells_the_driver_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", HEAD)  # as Ray's own tools take it
    _, plan = ray_plan(tmp_path, watchdog=False)
    assert plan.payload.address == HEAD and [p.kind for p in plan.processes] == ["job"]
    assert "--unwatched" in plan.main().argv and ENV_RUN_ID not in plan.main().env
    assert len(plan.notes) == 1 and "sidecar" not in plan.render()


def test_a_resume_on_ray_is_refused_in_one_line_naming_the_config(tmp_path: Path) -> None:
    config = load_config(AREAL, [f"cluster.fileroot={tmp_path}", "watchdog.on_hang=resume",
                                 "recover.mode=auto", "+recover.freq_steps=1"])  # fmt: skip
    with pytest.raises(UserError) as raised:
        check_resumable(config, RayBackend.recovery, "single_controller")
    assert str(raised.value) == (
        f"{AREAL}: watchdog.on_hang: resume is not on the ray backend yet; use on_hang: cancel "
        "(or report) there"
    )
    cancel = load_config(AREAL, [f"cluster.fileroot={tmp_path}"])
    check_resumable(cancel, RayBackend.recovery, "single_controller")  # nothing to refuse


@pytest.mark.parametrize(
    ("state", "info", "code"),
    [("SUCCEEDED", {}, 0), ("STOPPED", {}, -15), ("FAILED", {}, 1),
     ("FAILED", {"driver_exit_code": 7}, 7), ("SUCCEEDED", {"driver_exit_code": None}, 0)],
)  # fmt: skip
def test_the_job_s_exit_code_is_the_driver_s_else_its_end_state_s(
    state: str, info: dict, code: int
) -> None:
    assert job_returncode(state, info) == code


def ray_run(tmp_path: Path, out: io.StringIO) -> RayRun:
    _, plan = ray_plan(tmp_path, f"+launch.ray.address={HEAD}")
    return RayRun(plan, out)


def test_how_a_ray_run_ends_is_its_exit_code_and_its_last_words(tmp_path: Path) -> None:
    out = io.StringIO()
    run = ray_run(tmp_path, out)
    assert run.exit_code("SUCCEEDED", 0, interrupted=False) == ExitCode.OK
    assert out.getvalue() == ""
    assert run.exit_code("SUCCEEDED", 1, interrupted=False) == ExitCode.JOB_FAILED
    assert run.exit_code("FAILED", 1, interrupted=False) == ExitCode.JOB_FAILED
    assert out.getvalue().endswith("[areal-launch] the Ray job ended FAILED (driver exit 1)\n")
    assert run.exit_code("STOPPED", -15, interrupted=True) == ExitCode.INTERRUPTED
    layout = run.layout
    incident = layout.incidents_dir / "i-1"
    incident.mkdir(parents=True)
    layout.watch_dir.mkdir(parents=True, exist_ok=True)
    report = {"category": "inference_wedged", "summary": "server on node1 never answers"}
    (incident / "report.json").write_text(json.dumps(report))
    HangRequest("r5", "i-1", HangAction.CANCEL, 1.0).write(layout)
    out.seek(0), out.truncate()
    assert run.exit_code("STOPPED", -15, interrupted=False) == ExitCode.HANG_CANCELLED
    assert out.getvalue().splitlines() == [
        "[areal-launch] job cancelled after a hang: inference_wedged -- server on node1 never "
        "answers",
        f"[areal-launch] report: {incident / 'report.md'}",
    ]


def test_a_stopped_driver_s_exit_is_recorded_for_every_node_that_has_none(tmp_path: Path) -> None:
    run = ray_run(tmp_path, io.StringIO())
    layout = run.layout
    layout.watch_dir.mkdir(parents=True)
    launch = json.loads(run.plan.files[str(layout.launch_file)])
    launch["nodes"] = ["ray-head", "ray-node1"]  # as the driver names them once it runs
    layout.launch_file.write_text(json.dumps(launch))
    layout.job_exit_dir.mkdir()
    said = {"run_id": "r5", "returncode": 0, "time": 1.0}
    layout.job_exit("ray-head").write_text(json.dumps(said))  # the driver's own word
    run.record_exits(-15)
    assert json.loads(layout.job_exit("ray-head").read_text()) == said
    assert json.loads(layout.job_exit("ray-node1").read_text())["returncode"] == -15


def test_the_driver_s_and_sidecars_complete_lines_reach_the_terminal_once(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    layout.logs_dir.mkdir(parents=True)
    out = io.StringIO()
    tails = LogTails(layout, out)
    layout.ray_driver_log.write_text("step 1\nstep 2 (half")
    (layout.logs_dir / "sidecar_ray-head.out").write_text("sidecar up\n")
    tails.pump()
    assert out.getvalue() == "step 1\nsidecar up\n"
    with layout.ray_driver_log.open("a") as log:
        log.write(" a line)\nTraceback after our stop\n")
    tails.pump()
    assert out.getvalue().endswith("step 2 (half a line)\nTraceback after our stop\n")
    tails.muted = True  # the driver's dying words after a stop stay in its log only
    with layout.ray_driver_log.open("a") as log:
        log.write("KeyboardInterrupt\n")
    tails.pump()
    assert "KeyboardInterrupt" not in out.getvalue()


def test_the_guardian_ends_only_this_run_s_cluster_and_processes(tmp_path: Path) -> None:
    run_id = f"unit-{uuid.uuid4().hex[:8]}"
    layout = RunLayout(tmp_path)
    layout.watch_dir.mkdir(parents=True)
    raylet = subprocess.Popen(["sleep", "30"], start_new_session=True)  # a raylet's group
    rank = sleeper({**os.environ, ENV_RUN_ID: run_id})
    try:
        record = {"run_id": "another-run", "groups": [raylet.pid]}
        layout.ray_cluster_file.write_text(json.dumps(record))
        end_the_run(layout, run_id)
        assert rank.wait(5) == -9  # carried the run id
        assert raylet.poll() is None  # another run's cluster: untouched
        layout.ray_cluster_file.write_text(json.dumps({"run_id": run_id, "groups": [raylet.pid]}))
        end_the_run(layout, run_id)
        assert raylet.wait(5) == -9
    finally:
        for proc in (raylet, rank):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_jobs_api_that_refuses_the_client_at_first_is_asked_again(monkeypatch) -> None:
    """CI: the head's dashboard answered, then refused the client under load; the launcher's
    submit waits for it, ``status`` and ``cancel`` (patience 0) say so at once."""
    import ray.job_submission

    from areal_watchdog.common.errors import UserError
    from areal_watchdog.launch.ray import jobs

    tries: list[str] = []

    class Client:
        def __init__(self, address: str) -> None:
            tries.append(address)
            if len(tries) < 3:
                raise ConnectionError(f"Failed to connect to Ray at address: {address}.")

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", Client)
    monkeypatch.setattr(jobs.time, "sleep", lambda _s: None)
    assert isinstance(jobs.RayJobs("http://127.0.0.1:1", patience=30).client, Client)
    assert len(tries) == 3
    tries.clear()
    with pytest.raises(UserError, match="cannot reach Ray's Jobs API at http://127.0.0.1:1"):
        jobs.RayJobs("http://127.0.0.1:1")
    assert len(tries) == 1


class NotReadyHead:
    """A stand-in for Ray's dashboard on loopback: its version, and a job submit refused
    ``refusals`` times the way a head without a job agent yet refuses it (HTTP 500)."""

    def __init__(self, refusals: int, text: str, hang_up: bool = False) -> None:
        import http.server
        import threading

        self.posts: list[dict] = []
        head = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *_args) -> None:
                pass

            def answer(self, code: int, body: str) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def do_GET(self) -> None:
                self.answer(200, json.dumps({"version": "4", "ray_version": "2.60.0"}))

            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                head.posts.append(json.loads(self.rfile.read(length)))
                if hang_up and len(head.posts) == 1:  # took it, then closed without an answer
                    self.close_connection = True
                    return
                if hang_up:
                    self.answer(
                        400,
                        f"Job with submission_id {head.posts[0]['submission_id']} "
                        "already exists. Please use a different submission_id.",
                    )
                elif len(head.posts) <= refusals:
                    self.answer(500, text)
                else:
                    sid = head.posts[-1]["submission_id"]
                    self.answer(200, json.dumps({"submission_id": sid, "job_id": None}))

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_head_whose_job_agent_is_not_up_yet_is_asked_again(monkeypatch) -> None:
    """CI: Ray answered the submit with 500 "No available agent to submit job, please try again
    later." on a loaded machine. The launcher sends the same submission again (none was taken);
    any other refusal, or one past the patience, is one line at once."""
    from areal_watchdog.launch.ray import jobs

    monkeypatch.setattr(jobs.time, "sleep", lambda _s: None)
    not_ready = "No available agent to submit job, please try again later."
    head = NotReadyHead(refusals=2, text=not_ready)
    try:
        api = jobs.RayJobs(head.address)
        assert api.submit("python train.py", "run-7", {"A": "1"}, patience=90) == "run-7"
        assert [post["submission_id"] for post in head.posts] == ["run-7"] * 3
    finally:
        head.close()
    head = NotReadyHead(refusals=5, text=not_ready)
    try:
        with pytest.raises(UserError, match=r"^Ray refused the job at http://127\.0\.0\.1:\d+: .*"):
            jobs.RayJobs(head.address).submit("python train.py", "run-8", {}, patience=0)
        assert len(head.posts) == 1
    finally:
        head.close()
    head = NotReadyHead(refusals=0, text="", hang_up=True)  # CI: 'Connection aborted.'
    try:
        api = jobs.RayJobs(head.address)
        assert api.submit("python train.py", "run-10", {}, patience=90) == "run-10"
        assert len(head.posts) == 2  # the second said the first was taken: ours
    finally:
        head.close()
    head = NotReadyHead(refusals=5, text="Job with submission_id run-9 already exists.")
    try:
        with pytest.raises(UserError, match="already exists"):
            jobs.RayJobs(head.address).submit("python train.py", "run-9", {}, patience=90)
        assert len(head.posts) == 1
    finally:
        head.close()


def test_the_own_cluster_is_up_only_once_every_raylet_joined() -> None:
    """A head counting one node alive, then two (Ray's state API, ``/api/v0/nodes``): the
    cluster waits for both, so AReaL's 30 s placement-group wait never meets a missing node."""
    import http.server
    import threading

    from areal_watchdog.launch.ray.cluster import _joined

    asked: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_args) -> None:
            pass

        def do_GET(self) -> None:
            asked.append(1)
            nodes = [{"state": "ALIVE"}] * min(2, len(asked)) + [{"state": "DEAD"}]
            body = json.dumps({"data": {"result": {"result": nodes}}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    raylet = sleeper(dict(os.environ))
    try:
        address = f"http://127.0.0.1:{server.server_port}"
        assert _joined(address, 2, [raylet]) == 2 and len(asked) == 2
        raylet.kill()
        raylet.wait()
        assert _joined(address, 3, [raylet]) == 0  # a raylet that ended: no wait at all
    finally:
        server.shutdown()
        raylet.kill()
        raylet.wait()


FAKE_RAY = """
import http.server, json, os, sys, time
from pathlib import Path
if "--head" not in sys.argv:
    time.sleep(600)
tries = Path(os.environ["FAKE_RAY_DIR"]) / "head_tries"
tried = int(tries.read_text()) if tries.exists() else 0
tries.write_text(str(tried + 1))
if tried == 0:  # what Ray 2.60 said in CI, its raylet not registered within 30 s
    print("Exception: The current node timed out during startup. This could happen because "
          "some of the raylet failed to startup or the GCS has become overloaded.")
    sys.exit(1)
class Head(http.server.BaseHTTPRequestHandler):
    def log_message(self, *_args):
        pass
    def do_GET(self):
        nodes = [{"state": "ALIVE"}] * 2
        body = json.dumps({"data": {"result": {"result": nodes}}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
port = int(sys.argv[sys.argv.index("--dashboard-port") + 1])
http.server.HTTPServer(("127.0.0.1", port), Head).serve_forever()
"""


def test_a_ray_start_that_timed_out_under_load_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray gives a raylet 30 s to register with its GCS; under CI's load the head's did not,
    and its ``ray start`` ended: the cluster is started again, and says why."""
    from areal_watchdog.config.model import RaySection
    from areal_watchdog.launch.ray.cluster import OwnCluster

    fake = tmp_path / "fake_ray.py"
    fake.write_text(FAKE_RAY)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nshift 2\nexec {sys.executable} {fake} "$@"\n')
    python.chmod(0o755)
    monkeypatch.setenv("FAKE_RAY_DIR", str(tmp_path))
    cluster = OwnCluster.plan(RaySection(), 2, f"t{uuid.uuid4().hex[:8]}")
    said: list[str] = []
    raylets = cluster.start(str(python), tmp_path, said.append)
    try:
        assert said[0].startswith("Ray cluster: ray start of ray-head ended (")
        assert "The current node timed out during startup" in said[0]
        assert said[0].endswith("; starting it again (2 of 3)")
        assert said[1].startswith("Ray cluster of 2 node(s) up")
        assert all(proc.poll() is None for proc in raylets.procs)
    finally:
        raylets.stop(grace=1.0)
