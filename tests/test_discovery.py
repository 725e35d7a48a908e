"""Which live processes the sidecar counts as the job's, on real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from areal_watchdog.evidence.discovery import JobProcess, Scope, discover, helpers
from areal_watchdog.rundir.layout import ENV_NODE, ENV_RUN_ID, RunLayout

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
