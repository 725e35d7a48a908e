"""Which live processes the sidecar counts as the job's, on real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from areal_watchdog.evidence.discovery import JobProcess, Scope, discover, helpers
from areal_watchdog.rank.sitehook import DIRECTORY as SITEHOOK
from areal_watchdog.rundir.layout import (
    ENV_NODE,
    ENV_RANK_ROLE,
    ENV_RUN_ID,
    ENV_WATCH_DIR,
    RunLayout,
)

# A rollout worker that starts a helper (a reward pool process) and, as a Slurm task's shell
# does before it execs the worker, our standby sidecar.
WORKER = (
    "import subprocess, sys, time\n"
    "sleep = [sys.executable, '-c', 'import time; time.sleep(60)']\n"
    "kids = [subprocess.Popen(sleep), subprocess.Popen([*sleep, 'areal_watchdog.watch.sidecar'])]\n"
    "print(*(k.pid for k in kids), flush=True)\n"
    "time.sleep(60)\n"
)
# A controller that, like AReaL's actor worker after /set_env, starts a helper carrying RANK.
PARENT = (
    "import os, subprocess, sys, time\n"
    "os.environ.update(RANK='0', LOCAL_RANK='0')\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_helper_that_inherited_rank_is_not_a_rank(tmp_path: Path) -> None:
    """A rank is started by torchrun, srun or a scheduler, never by another part of the job:
    a helper that inherited ``RANK`` would otherwise replace the real rank 0 and, when it ends,
    read as "rank 0 exited"."""
    config = tmp_path / "job.yaml"
    config.write_text("{}\n")
    env = {**os.environ, ENV_RUN_ID: "r1", ENV_NODE: "n"}
    rank = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**env, "RANK": "0", "LOCAL_RANK": "0"},
    )
    controller = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(config)], env=env, stdout=subprocess.PIPE, text=True
    )
    helper = int(controller.stdout.readline())
    try:
        time.sleep(0.3)
        found = discover(
            RunLayout(tmp_path / "run"), Scope("r1", "n", controller_config=str(config))
        )
        assert {r: p.pid for r, p in found.ranks.items()} == {0: rank.pid}
        assert [(p.pid, p.role) for p in found.workers.values()] == [(controller.pid, "controller")]
        assert helper not in {p.pid for p in found.workers.values()}
    finally:
        for proc in (rank, controller):
            proc.kill()
            proc.wait()
        os.kill(helper, signal.SIGKILL)


def test_a_process_that_becomes_a_rank_when_it_execs_is_found(tmp_path: Path) -> None:
    """A Slurm task or a wrapper script starts without the run's environment and execs the rank
    a moment later: a discovery in between must not remember it as no part of the run (the
    processes that are not are remembered, their environments not read again)."""
    becomes = (
        "import os, sys, time\n"
        "time.sleep(1.5)\n"
        "os.execve(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)'], "
        f"{{**os.environ, '{ENV_RUN_ID}': 'r1', '{ENV_NODE}': 'n'}})\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", becomes], env={**os.environ, "RANK": "0", "LOCAL_RANK": "0"}
    )
    layout, scope = RunLayout(tmp_path / "run"), Scope("r1", "n")
    try:
        time.sleep(0.5)
        assert discover(layout, scope).ranks == {}
        time.sleep(2.0)
        assert {r: p.pid for r, p in discover(layout, scope).ranks.items()} == {0: proc.pid}
    finally:
        proc.kill()
        proc.wait()


def test_our_sidecar_started_under_a_worker_is_no_helper_of_the_job(tmp_path: Path) -> None:
    """Its stacks move between two looks: counted as a helper, it made the second look before
    a cancel say "the stacks of pid N changed" and leave a hung job running."""
    (tmp_path / "run").mkdir()
    env = {**os.environ, ENV_RUN_ID: "r1", ENV_NODE: "n"}
    worker = subprocess.Popen([sys.executable, "-c", WORKER], env=env, stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    pool, sidecar = map(int, worker.stdout.readline().split())
    try:
        time.sleep(0.3)
        part = JobProcess(worker.pid, "n", 0.0, role="rollout", index=0)
        found = helpers(RunLayout(tmp_path / "run"), Scope("r1", "n"), {worker.pid: part})
        assert [(h.pid, h.role, h.parent_pid) for h in found] == [(pool, "helper", worker.pid)]
    finally:
        worker.kill()
        worker.wait()
        for pid in (pool, sidecar):
            os.kill(pid, signal.SIGKILL)


def test_a_sidecar_reads_its_own_nodes_registrations_never_the_jobs(tmp_path: Path) -> None:
    """The fallback when fewer ranks are found than expected (start-up, a dead rank, the end of
    the job) used to open every rank's registration of the whole job, on every poll of every
    sidecar: 8,192 opens per poll at 1,024 nodes. Registrations are kept by node now."""
    layout = RunLayout(tmp_path / "run")
    for node in ("a", "b", "c"):
        for rank in range(4):
            path = layout.registration(rank, node)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text('{"run_id": "r1", "rank": 0, "node": "x", "pid": 1}')
    opened: list[str] = []

    def audit(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], str) and "by_node" in args[0]:
            opened.append(args[0])

    sys.addaudithook(audit)
    discover(layout, Scope("r1", "b"), expected=8)
    mine = {p for p in opened if "/by_node/b/" in p}
    assert opened and set(opened) == mine, opened
    assert len(mine) == 4


# A Ray worker as Ray starts one (``default_worker.py``), which becomes AReaL's ``actor/1``
# actor a moment later: the name Ray's runtime context gives once the actor exists.
RAY_STANDIN = (
    "import time\n"
    "class _Context:\n"
    "    def get_actor_name(self):\n"
    "        return 'actor/1' if time.monotonic() > BORN + 0.5 else None\n"
    "BORN = time.monotonic()\n"
    "def get_runtime_context():\n"
    "    return _Context()\n"
)


def test_a_ray_worker_is_found_once_ray_names_the_areal_worker_it_holds(tmp_path: Path) -> None:
    """AReaL's RayScheduler runs each worker as an actor in a process Ray started before it
    knew which: our hook in it records the role once the actor is named, and the sidecar of its
    raylet's node finds it as the rank it holds; another raylet's worker is not this node's,
    and a role record older than the process that has its pid is not believed."""
    run = tmp_path / "run"
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text(RAY_STANDIN)
    worker = tmp_path / "default_worker.py"
    worker.write_text("import ray, time\ntime.sleep(60)\n")
    env = {
        **os.environ, ENV_RUN_ID: "r1", ENV_WATCH_DIR: str(run / "watchdog"),
        ENV_RANK_ROLE: "actor", "PYTHONPATH": os.pathsep.join([SITEHOOK, str(tmp_path)]),
    }  # fmt: skip
    here, there = (
        subprocess.Popen([sys.executable, str(worker)], env={**env, "RAY_RAYLET_PID": raylet})
        for raylet in ("4242", "4343")
    )
    layout = RunLayout(run)
    try:
        deadline = time.monotonic() + 20
        while not layout.process_role_record(here.pid).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.3)
        found = discover(layout, Scope("r1", "ray-head", 2, "actor", raylet="4242"))
        assert [(r, p.pid, p.label()) for r, p in found.ranks.items()] == [(1, here.pid, "actor 1")]
        assert found.ranks[1].cooperative_signal is not None  # armed like any other part
        record = layout.process_role_record(here.pid)
        record.write_text(json.dumps({**json.loads(record.read_text()), "time": 1.0}))  # 1970
        assert discover(layout, Scope("r1", "ray-head", 2, "actor", raylet="4242")).ranks == {}
    finally:
        for proc in (here, there):
            proc.kill()
            proc.wait()
