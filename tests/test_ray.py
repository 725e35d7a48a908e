"""``areal-launch --watchdog ray``: AReaL's SPMD experiment as a Ray job on a real Ray cluster
of this machine's own (a head and a second raylet on 127.0.0.1, in a loopback-only network
namespace), a sidecar on each Ray node placed by Ray, one report across the nodes."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from recording import record_evidence
from test_areal import (
    CONFIG,
    FAST,
    LOOPBACK,
    LOOPBACK_SCRIPT,
    TWO_RANKS,
    make_harness,
    needs_areal,
    needs_root,
    run_areal,
)
from test_launcher_lifecycle import wait_for

from areal_watchdog.cli import main
from areal_watchdog.config.model import RaySection
from areal_watchdog.launch.ray.cluster import TEMP_ROOT, OwnCluster, cluster_environment
from areal_watchdog.launch.ray.sidecars import HEAD_RESOURCE, live_nodes
from areal_watchdog.rundir.layout import RunLayout
from conftest import AREAL2_PYTHON
from testkit.launcher import Launcher, LaunchResult, processes_under
from testkit.reports import read_reports

# Two Ray nodes with one logical GPU each: AReaL's Ray launcher puts the inference server on
# one (sglang:d1) and the trainer on the other (fsdp:d1); the CPU harness ignores the "GPU".
TWO_NODES = [
    "launch.mode=spmd", "cluster.n_nodes=2", "cluster.n_gpus_per_node=1",
    "actor.scheduling_spec.0.gpu=1",
]  # fmt: skip


@pytest.fixture(scope="module")
def ray_harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_harness(tmp_path_factory.mktemp("ray-harness") / "h")


@pytest.fixture
def ray_launcher(launcher: Launcher) -> Iterator[Launcher]:
    """The launcher fixture, and after it every process group of the runs' own Ray clusters
    killed, passed or failed (Ray's agents carry none of the marks its cleanup looks for)."""
    yield launcher
    for record in launcher.root.glob("*/*/watchdog/ray_cluster.json"):
        for group in json.loads(record.read_text())["groups"]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)


@pytest.fixture
def existing_ray(tmp_path: Path) -> Iterator[ExistingCluster]:
    """A two-node Ray cluster that was there before the run, as a team's is, in a loopback-only
    network namespace of its own, with Ray's token authentication on (a token of its own, never
    ``~/.ray``'s). Ended, namespace included, whatever the test did: every process of its
    session and of its raylets."""
    token = secrets.token_hex(32)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    name = f"ray-lo-{os.getpid()}"
    enter = ["nsenter", f"--net=/var/run/netns/{name}"]
    cluster = OwnCluster.plan(RaySection(gpus_per_node=1), 2, f"x{os.getpid()}")
    subprocess.run(["bash", str(LOOPBACK_SCRIPT), "--create", name], check=True)
    head, worker = (shlex.join([*unnamed(a), "--block"]) for a in cluster.commands(sys.executable))
    gcs_up = shlex.join([sys.executable, "-c", "import socket; socket.create_connection("
                         f"('127.0.0.1', {cluster.gcs_port}), 1)"])  # fmt: skip
    starts = (
        f"{head} & for i in $(seq 90); do {gcs_up} 2>/dev/null && break; sleep 1; done; {worker}"
    )
    session = subprocess.Popen(
        [*enter, "bash", "-c", f"{starts} & wait"], start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "ray-start.log").open("w"),
        env={**cluster_environment(), **auth},
    )  # fmt: skip
    existing = ExistingCluster(enter, cluster, auth)
    try:
        assert "2" in existing.run("print(alive(ray))", timeout=90)
        yield existing
    finally:
        raylets = {str(p.pid) for p in _session(session.pid) if p.name() == "raylet"}
        for proc in [*_session(session.pid), *_started_by(raylets)]:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        session.wait()
        subprocess.run(["bash", str(LOOPBACK_SCRIPT), "--delete", name], capture_output=True)


def unnamed(argv: list[str]) -> list[str]:
    """``ray start`` without ``--node-name``: Ray names both nodes by their one IP."""
    at = argv.index("--node-name")
    return argv[:at] + argv[at + 2 :]


CLUSTER_PROBE = """
import sys, time, ray
def alive(ray):
    return sum(n["Alive"] for n in ray.nodes())
deadline = time.monotonic() + float(sys.argv[2])
while True:
    try:
        ray.init(address=sys.argv[1], log_to_driver=False)
        if alive(ray) >= 2 or time.monotonic() > deadline:
            break
        ray.shutdown()
    except Exception:
        if time.monotonic() > deadline:
            raise
    time.sleep(1)
"""


@dataclass(frozen=True)
class ExistingCluster:
    """The fixture's cluster: the prefix that enters its namespace, its ports, and what a
    client needs in its environment to be let in (Ray's token auth)."""

    enter: list[str]
    cluster: OwnCluster
    auth: dict[str, str]

    def run(self, code: str, timeout: float = 10) -> str:
        """What ``code`` prints, run as a driver of the cluster (``ray`` connected, 2 nodes
        up)."""
        gcs = f"127.0.0.1:{self.cluster.gcs_port}"
        probe = [*self.enter, sys.executable, "-c", CLUSTER_PROBE + code, gcs, str(timeout)]
        env = {**cluster_environment(), **self.auth}
        return subprocess.run(
            probe, capture_output=True, text=True, timeout=timeout + 60, env=env
        ).stdout


def _session(sid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(proc.pid) == sid:
                found.append(proc)
    return found


def _started_by(raylets: set[str]) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if proc.environ().get("RAY_RAYLET_PID") in raylets:
                found.append(proc)
    return found


def the_run_is_gone(run_dir: Path, within: float) -> list[str]:
    """What of the run is still alive after ``within`` seconds: its processes, and every
    process of its own Ray cluster's process groups (Ray's agents carry none of our marks)."""
    record = run_dir / "watchdog" / "ray_cluster.json"  # the own cluster's, if the run had one
    groups = set(json.loads(record.read_text())["groups"]) if record.exists() else set()
    root = run_dir.parent.parent  # the fileroot every process of the test's run mentions
    deadline = time.monotonic() + within
    while True:
        grouped = [p for p in psutil.process_iter() if _group(p) in groups]
        left = sorted({_describe(p) for p in [*processes_under(root), *grouped] if _alive(p)})
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1.0)


def _group(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except OSError:
        return None


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _env(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except psutil.Error:
        return {}


def _describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {' '.join(proc.cmdline()[:2])}"
    except psutil.Error:
        return str(proc.pid)


def test_the_dry_run_shows_the_cluster_the_driver_and_a_sidecar_per_node(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["--watchdog", "ray", str(CONFIG), f"cluster.fileroot={tmp_path}", *TWO_NODES,
                 "--dry-run"])  # fmt: skip
    shown = capsys.readouterr().out
    assert code == 0
    assert "process `ray start (ray-head)` (cluster)" in shown
    assert "--head" in shown and "--node-ip-address 127.0.0.1" in shown
    assert "--dashboard-host 127.0.0.1" in shown and "process `ray start (ray-node1)`" in shown
    assert "-m areal_watchdog.launch.ray.driver" in shown and "--nodes 2" in shown
    assert "-m areal.infra.launcher.ray" in shown and "AREAL_WATCHDOG_RUN_ID=" in shown
    assert "one sidecar per Ray node: a detached actor pinned to the node" in shown


def test_the_single_controller_s_dry_run_shows_the_script_connected_to_ray_first(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["--watchdog", "ray", str(CONFIG), f"cluster.fileroot={tmp_path}",
                 "launch.mode=single_controller", "--dry-run"])  # fmt: skip
    shown = capsys.readouterr().out
    assert code == 0
    assert "-m areal_watchdog.rank.ray.ray_controller" in shown and "gsm8k_rl.py" in shown
    assert "-m areal.infra.launcher.ray" not in shown
    assert "AREAL_WATCHDOG_RANK_ROLE=actor" in shown
    job_config = next((tmp_path / "gsm8k-grpo").glob("*/watchdog/job_config.yaml"), None)
    assert job_config is None  # a dry run writes nothing


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["launch.mode=torchrun"], "`launch.mode`: the ray backend runs AReaL experiments"),
        (["+launch.ray.address=127.0.0.1:6379"], "must be the Jobs API's URL"),
        (["+launch.ray.colour=red"], "launch.ray"),
    ],
)
def test_what_the_ray_backend_cannot_run_is_refused_in_one_line(
    overrides: list[str], said: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["ray", str(CONFIG), f"cluster.fileroot={tmp_path}", *overrides, "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and said in err and "Traceback" not in err


@needs_areal
@needs_root
@pytest.mark.slow
def test_a_wedged_server_on_an_existing_clusters_node_is_named_and_only_the_job_stopped(
    ray_launcher: Launcher, ray_harness: Path, existing_ray: ExistingCluster
) -> None:
    """On a cluster that was there before (RAY_ADDRESS: its Jobs API; Ray's token auth on, the
    token in the launcher's environment as Ray's docs say), the inference server on one Ray
    node stops answering after its 6th request while the trainer on the other waits for
    rollouts. One report names the server and its node; the Ray job is stopped through the Jobs
    API; nothing of the run is left, and the cluster is as it was: both nodes up, no sidecar.
    The token is nowhere in what the launcher printed or wrote."""
    enter, cluster = existing_ray.enter, existing_ray.cluster
    ask = f"import urllib.request as u\ntry: u.urlopen('{cluster.address}/api/version')\n" + (
        "except Exception as e: print(getattr(e, 'code', e))"
    )
    tokenless = [*enter, sys.executable, "-c", ask]
    assert subprocess.run(tokenless, capture_output=True, text=True).stdout.strip() == "401"
    result = run_areal(
        ray_launcher, ray_harness, "ray", python=sys.executable, backend="ray", prefix=enter,
        env={"RAY_ADDRESS": cluster.address, **existing_ray.auth},
        # Under CI's load a Ray node's sidecar once went 20 s without a status while AReaL's
        # servers started (the run was named node_lost): a node's silence counts after 30 s here.
        overrides=[*TWO_NODES, "+launch.env.AREAL_STANDIN_WEDGE_AFTER=6",
                   "+watchdog.node_timeout=30"],
        # CI once ran AReaL's recompute_logp in 88 s here (three AReaL jobs on two cores): the
        # threshold AReaL's own timings set rose to 271 s, and the report came after 420 s
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 3, result.output[-4000:]
    assert "ray start" not in result.output and "stopping the Ray job" in result.output
    nodes = result.output.split("2 Ray node(s): ", 1)[1].split("\n", 1)[0].split(", ")
    assert len(nodes) == 2 and all(n.startswith("127.0.0.1-") for n in nodes), nodes
    (report,) = result.reports
    assert (report["category"], report["cause"]) == ("rollout_stalled", "inference_wedged")
    (culprit,) = report["culprit_workers"]
    assert culprit["role"] == "inference_server"
    rank0 = report["ranks"][0]
    assert {culprit["node"], rank0["node"]} == set(nodes), report["ranks"]
    record_evidence(report, "inference_wedged--areal-spmd-ray", "rollout")
    assert the_run_is_gone(result.run_dir, within=20) == []
    left = existing_ray.run("print(alive(ray), ray.util.list_named_actors(True))")
    assert left.split(" ", 1)[0] == "2" and "sidecar-" not in left, left
    token = existing_ray.auth["RAY_AUTH_TOKEN"]
    assert token not in result.output
    written = [p for p in result.run_dir.rglob("*") if p.is_file()]
    assert written and [p for p in written if token in p.read_text("latin-1")] == []


@needs_areal
@needs_root
@pytest.mark.slow
# where the CPU is idle: beside the three workers of the first part, its two-node cluster's
# dashboard refused the job three CI runs in a row (500 "no available agent", a connection
# closed, connection refused for 90 s)
@pytest.mark.beside_slurm
def test_a_killed_raylet_is_a_lost_node_and_a_killed_launcher_leaves_nothing_behind(
    ray_launcher: Launcher, ray_harness: Path
) -> None:
    """The raylet of ``ray-node1`` is killed after the first step: that node's sidecar dies
    with it, and the head's reports the node lost, naming it (and rank 0, when Ray placed the
    trainer there rather than the inference server: the placement group decides). Then
    areal-launch itself is killed (kill -9): nothing of the run, its cluster included, stays."""
    (ray_launcher.root / "harness").symlink_to(ray_harness)
    proc, run_dir = ray_launcher.start(
        [*FAST, *TWO_NODES, "watchdog.on_hang=report", "total_train_steps=100"],
        trial="lost", config=CONFIG, backend="ray", prefix=LOOPBACK,
    )  # fmt: skip
    seen = wait_for(proc, "first step seen", timeout=240)
    groups = json.loads((run_dir / "watchdog" / "ray_cluster.json").read_text())["groups"]
    raylet = next(  # this run's: another test's own cluster may have a ray-node1 too
        p for p in psutil.process_iter(["name", "cmdline"])
        if p.info["name"] == "raylet" and "--node-name=ray-node1" in p.info["cmdline"]
        and _group(p) in groups
    )  # fmt: skip
    trainer_there = any(
        _env(p).get("RANK") == "0" and _env(p).get("RAY_RAYLET_PID") == str(raylet.pid)
        for p in processes_under(ray_launcher.root)
    )
    raylet.kill()
    seen += wait_for(proc, "report written", timeout=120)
    report, *_ = read_reports(run_dir)  # the first; with on_hang=report the watching goes on
    assert report["category"] == "node_lost", (report["summary"], seen[-3000:])
    assert report["unanswered_nodes"] == ["ray-node1"], report["summary"]
    assert report["culprit_ranks"] == ([0] if trainer_there else []), report["summary"]
    vanished = "Node ray-node1 (rank 0) vanished" if trainer_there else "Node ray-node1 vanished"
    assert vanished in report["summary"]
    if trainer_there:
        record_evidence(report, "node_lost_w1_r0--areal-spmd-ray-raylet-killed")
    proc.kill()
    proc.wait()
    assert the_run_is_gone(run_dir, within=30) == []


@needs_areal
@needs_root
@pytest.mark.slow
@pytest.mark.parametrize("areal", ["2.0.0"], indirect=True)  # 1.0.4: the two tests above
def test_a_healthy_run_on_ray_completes_without_a_report(
    ray_launcher: Launcher, ray_harness: Path, areal: str
) -> None:
    """Two steps on a cluster of its own: exit 0 (AReaL's launcher ends a completed run with
    JobException(COMPLETED), which is no failure), no incident, the cluster gone."""
    result = run_areal(
        ray_launcher, ray_harness, "healthy", python=areal, backend="ray",
        overrides=[*TWO_NODES, "total_train_steps=2"],
    )  # fmt: skip
    assert result.returncode == 0, result.output[-4000:]
    assert result.reports == []
    assert "last step seen: step 2 of 2" in result.output
    assert "job completed (last step 2); 0 incident(s)" in result.output
    assert "trajectory: 2 step(s) dumped" in result.output  # by rank 0, a task of Ray's
    assert the_run_is_gone(result.run_dir, within=20) == []
    run_id = json.loads((result.run_dir / "watchdog" / "launch.json").read_text())["run_id"]
    assert not Path(TEMP_ROOT.format(run_id=run_id)).exists()  # Ray's temp dir went with it


def test_ray_nodes_are_named_by_ray_the_head_first_and_unique() -> None:
    nodes = [
        {"NodeID": "bbbbbb01", "Alive": True, "NodeName": "10.0.0.2", "Resources": {}},
        {"NodeID": "cccccc02", "Alive": False, "NodeName": "10.0.0.3", "Resources": {}},
        {"NodeID": "dddddd03", "Alive": True, "NodeName": "10.0.0.2", "Resources": {}},
        {"NodeID": "aaaaaa04", "Alive": True, "NodeName": "10.0.0.1",
         "Resources": {HEAD_RESOURCE: 1.0}},
    ]  # fmt: skip
    named = live_nodes(nodes)
    assert [n.name for n in named] == ["10.0.0.1", "10.0.0.2-bbbbbb", "10.0.0.2-dddddd"]
    assert named[0].node_id == "aaaaaa04"


def test_on_an_existing_cluster_nothing_is_started_and_its_jobs_api_is_used(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")
    assert main(["--watchdog", "ray", str(CONFIG), f"cluster.fileroot={tmp_path}", *TWO_NODES,
                 "--dry-run"]) == 0  # fmt: skip
    shown = capsys.readouterr().out
    assert "ray start" not in shown and "--nodes 1" in shown  # the driver names what it finds
    assert "submitted to the Ray cluster at http://127.0.0.1:8265 as Ray job" in shown
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert main(["ray", str(CONFIG), f"cluster.fileroot={tmp_path}", *TWO_NODES, "--dry-run"]) == 2
    assert "RAY_ADDRESS must be the Jobs API's URL" in capsys.readouterr().err


def test_areal_s_completed_exception_is_a_completed_run() -> None:
    """AReaL's Ray launcher raises JobException(COMPLETED) when its trainer returns."""
    from areal_watchdog.launch.ray.driver import AREAL_COMPLETED, areal_exit

    last = "launcher.JobException: Job gsm8k-grpo_r1:trainer JobState.COMPLETED at node ray"
    failed = "launcher.JobException: Job gsm8k-grpo_r1:trainer JobState.FAILED at node ray"
    assert AREAL_COMPLETED.search(last) and not AREAL_COMPLETED.search(failed)
    assert areal_exit(1, completed=True) == 0
    assert areal_exit(1, completed=False) == 1 and areal_exit(-15, completed=True) == -15


def ray_ended_a_worker(result: LaunchResult) -> str | None:
    """What says that a worker process of the job ended from outside it, neither by its own
    exception nor by the watchdog, before the report the test checks (None: nothing). Seen
    twice on CI's loaded machine: an actor that never ran while AReaL created its workers
    ("The actor never ran", in create_workers; stop 64), and a rank that ran its exit handlers
    at the hung step with no exception of its own ("exited (code unknown)", posted as
    rank_crashed; stop 65). A SIGTERM sent by hand to the spinning rank here gave that record,
    or, where the controller saw the death first, Ray's "The process receives a SIGTERM".
    None of them is a hang the watchdog could have told otherwise."""
    if "The actor never ran" in result.output and "in create_workers" in result.output:
        return "an actor never ran"
    if "The process receives a SIGTERM" in result.output:
        return "Ray saw a worker receive SIGTERM"
    for report in result.reports:
        if report["category"] == "rank_crashed" and "exited (code unknown)" in report["summary"]:
            return report["summary"]
    return None


def what_ray_said_of_its_workers(run_dir: Path) -> str:
    """The lines of the job's Ray driver log on a worker's end, for the test's output."""
    log = RunLayout(run_dir).ray_driver_log
    words = ("SIGTERM", "died", "killed", "dead", "exit")
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return "\n".join(line for line in lines if any(w in line for w in words))[-6000:]


@needs_areal
@needs_root
@pytest.mark.slow
@pytest.mark.parametrize("areal", ["2.0.0"], indirect=True)  # 1.0.4: measured, docs/ray.md
def test_single_controller_on_ray_names_the_spinning_rank_of_its_ray_actors(
    ray_launcher: Launcher, tmp_path: Path, areal: str
) -> None:
    """AReaL's single controller on Ray (its RayScheduler places every worker as an actor):
    at step 2 one of the two FSDP ranks spins in the model's own code while the other waits in
    an all-gather. Two CPUs a node for three workers: Ray spreads them over both nodes. The
    report names the spinning rank, its actor and the node it runs on; nothing is left."""
    harness = make_harness(tmp_path / "h", "--train-poison-from", "4")  # row 4: step 2

    def run(trial: str) -> LaunchResult:
        return run_areal(
            ray_launcher, harness, trial, python=areal, backend="ray",
            overrides=["launch.mode=single_controller", "cluster.n_nodes=2",
                       "+launch.ray.cpus_per_node=2", *TWO_RANKS,
                       # CI once took over AReaL's fixed 30 s to start the eval-rollout worker
                       "+launch.env.AREAL_WATCHDOG_RAY_WORKER_STARTUP=180"],
        )  # fmt: skip

    result = run("sc")
    if lost := ray_ended_a_worker(result):  # once: the machine failed, not what is checked
        said = what_ray_said_of_its_workers(result.run_dir)
        print(f"first run lost a worker ({lost}); Ray said:\n{said}")
        assert the_run_is_gone(result.run_dir, within=20) == []
        result = run("sc2")  # AReaL refuses "-" in a trial name
    assert result.returncode == 3, result.output[-4000:]
    (report,) = result.reports
    assert (report["category"], report["last_step"]) == ("straggler", 2), report["summary"]
    (culprit,) = report["culprit_ranks"]
    assert "restart_positions() <- TinyQwen2ForCausalLM.forward()" in report["summary"]
    assert f"while rank {1 - culprit} waits in all_gather_single" in report["summary"]
    nodes = {r["node"] for r in report["ranks"]} | {w["node"] for w in report["workers"]}
    assert nodes == {"ray-head", "ray-node1"}, report["ranks"]
    exits = RunLayout(result.run_dir).job_exit_dir
    assert {p.stem for p in exits.glob("*.json")} == nodes  # the stopped job's end, every node
    release = "areal2" if areal == str(AREAL2_PYTHON) else "areal"
    record_evidence(report, f"straggler_w2_r{culprit}--{release}-single-controller-ray")
    assert the_run_is_gone(result.run_dir, within=20) == []
