"""What runs on every node of a Slurm job, as the submitit task (one per node).

It starts torchrun for this node's ranks (``--nnodes``, ``--node-rank``, rendezvous on the first
node's address), records how it ended for the sidecars, and gives the watchdog a bounded moment
to write its final report before the step ends. In AReaL's SPMD mode the first nodes run AReaL's
inference-server launcher instead, and the others start torchrun once the servers registered.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from areal_watchdog.common.atomic import read_json, write_json_atomic
from areal_watchdog.launch.planning.gate import pass_gate
from areal_watchdog.launch.planning.plan import Gate
from areal_watchdog.launch.planning.torchrun import multi_node, torchrun_command
from areal_watchdog.launch.slurm.control.jobs import expand_nodelist, last_said, slurm
from areal_watchdog.launch.slurm.control.same_allocation import resumed_attempt
from areal_watchdog.rundir.layout import ENV_NODE, RunLayout

SIDECAR_FINISH_WAIT = 30.0  # seconds to wait for the leading sidecar's final word
ADDRESS_PATIENCE = 120.0  # seconds to ask a silent controller for the first node's address
ADDRESS_RETRY = 2.0


@dataclass(frozen=True)
class ServerNodes:
    """AReaL's SPMD mode in one job: the first ``count`` nodes run AReaL's server launcher
    (``argv`` with ``env``); the others wait at ``gate`` until the servers registered, then run
    torchrun with their addresses."""

    count: int
    argv: list[str]
    env: dict[str, str]
    gate: Gate


@dataclass(frozen=True)
class NodeJob:
    """Everything a node needs to start its share of the job (pickled by submitit)."""

    run_dir: str
    run_id: str
    python: str
    nproc_per_node: int
    rank_command: list[str]  # what torchrun runs on every rank
    env: dict[str, str]
    watchdog: bool
    servers: ServerNodes | None = None

    def __call__(self) -> int:
        return run_node(self)

    def command(self, node: str, node_rank: str, n_nodes: int, master: str, port: str) -> list[str]:
        """The torchrun command of one node."""
        return torchrun_command(
            self.python,
            RunLayout(Path(self.run_dir)),
            node,
            self.nproc_per_node,
            multi_node(n_nodes, node_rank, master, port),
            self.rank_command,
        )

    def preview(self, n_nodes: int) -> list[str]:
        """The same command as ``--dry-run`` shows it, before Slurm has allocated the nodes."""
        serving = self.servers.count if self.servers else 0
        node_rank = f"$((SLURM_NODEID-{serving}))" if serving else "$SLURM_NODEID"
        first = "$FIRST_TRAINER_NODE_ADDR" if serving else "$FIRST_NODE_ADDR"
        return self.command("$SLURMD_NODENAME", node_rank, n_nodes, first, "$RENDEZVOUS_PORT")


def slurm_nodes() -> list[str]:
    """The job's node names in Slurm's order."""
    return expand_nodelist(os.environ["SLURM_JOB_NODELIST"])


def node_address(node: str, patience: float = ADDRESS_PATIENCE) -> str:
    """The address Slurm knows a node by (``NodeAddr``), for the rendezvous. Every node asks
    at once when the job starts: a controller that does not answer is asked again for
    ``patience`` seconds, then the node's name stands in (most clusters resolve it)."""
    deadline = time.monotonic() + patience
    while True:
        out = slurm(["scontrol", "show", "node", node])
        for word in out.stdout.split():
            if word.startswith("NodeAddr="):
                return word.split("=", 1)[1]
        if out.returncode == 0 or time.monotonic() >= deadline:
            said = last_said(out, "no NodeAddr")
            here = os.environ.get("SLURMD_NODENAME", "?")
            _say(here, f"scontrol show node {node}: {said}; the rendezvous uses the name {node}")
            return node
        time.sleep(ADDRESS_RETRY)


def rendezvous_port(job_id: str) -> int:
    return 20_000 + int(job_id) % 20_000


def resumed(job: NodeJob) -> NodeJob:
    """The task of a resumed attempt: the run id and variables the launcher asked for."""
    attempt = resumed_attempt(job.run_dir)
    if attempt is None:
        return job
    run_id, extra = attempt
    servers = job.servers and replace(job.servers, env={**job.servers.env, **extra})
    return replace(job, run_id=run_id, env={**job.env, **extra}, servers=servers)


def run_node(job: NodeJob) -> int:
    """Run this node's share to its end (torchrun, or AReaL's inference servers); raise on
    failure so Slurm sees it."""
    job = resumed(job)  # a step run again in the same allocation: the new attempt's
    node = os.environ["SLURMD_NODENAME"]
    nodes = slurm_nodes()
    layout = RunLayout(Path(job.run_dir))
    serving = job.servers.count if job.servers else 0
    if job.servers is not None and nodes.index(node) < serving:
        returncode = _serve(job.servers, job.run_id, layout, node, nodes[serving:])
    else:
        returncode = _train(job, node, nodes[serving:])
    _record_end(layout, job.run_id, node, returncode)
    if job.watchdog:
        _wait_for_report(layout, job.run_id)
    if returncode != 0:
        raise RuntimeError(f"node {node}'s part of the job exited with code {returncode}")
    return returncode


def _train(job: NodeJob, node: str, trainers: list[str]) -> int:
    """torchrun for this node's ranks, once the inference servers registered (SPMD)."""
    extra: dict[str, str] | None = {}
    if job.servers is not None:
        extra = pass_gate(job.servers.gate, lambda: None, lambda m: _say(node, m))
        if extra is None:
            return 1
    port = rendezvous_port(os.environ["SLURM_JOB_ID"])
    master = node_address(trainers[0])
    cmd = job.command(node, str(trainers.index(node)), len(trainers), master, str(port))
    env = {**os.environ, **job.env, **extra, ENV_NODE: node}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):  # submitit's own, not torchrun's
        env.pop(name, None)
    _say(node, " ".join(cmd))
    return subprocess.Popen(cmd, env=env, stdout=sys.stdout, stderr=sys.stderr).wait()


def _serve(
    servers: ServerNodes, run_id: str, layout: RunLayout, node: str, trainers: list[str]
) -> int:
    """AReaL's server launcher, until the trainer nodes ended (then it is stopped, and the
    trainers' worst exit code is this node's) or the servers die."""
    env = {**os.environ, **servers.env, ENV_NODE: node}
    _say(node, " ".join(servers.argv))
    proc = subprocess.Popen(
        servers.argv, env=env, stdout=sys.stdout, stderr=sys.stderr, start_new_session=True
    )
    while proc.poll() is None:
        ends = [read_json(layout.job_exit(n)) for n in trainers]
        if all(isinstance(e, dict) and e.get("run_id") == run_id for e in ends):
            _stop_group(proc)
            return max(int(e.get("returncode") or 0) for e in ends)  # type: ignore[union-attr]
        time.sleep(1)
    return proc.returncode


def _stop_group(proc: subprocess.Popen) -> None:
    """End AReaL's server launcher and its servers: a SIGTERM ends the launcher before its
    own cleanup runs, so the servers it started are signalled with it, as its process group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # what of the group outlived its launcher
    proc.wait()


def _record_end(layout: RunLayout, run_id: str, node: str, returncode: int) -> None:
    layout.job_exit_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        layout.job_exit(node),
        {"run_id": run_id, "node": node, "returncode": returncode, "time": time.time()},
    )


def _say(node: str, message: str) -> None:
    print(f"[areal-launch {node}] {message}", flush=True)


def _wait_for_report(layout: RunLayout, run_id: str) -> None:
    """Give the leading sidecar time to conclude (and report a failure) before the step ends:
    when this task returns, Slurm ends the job and with it the sidecars."""
    deadline = time.monotonic() + SIDECAR_FINISH_WAIT
    while time.monotonic() < deadline:
        record = read_json(layout.finished_file)
        if isinstance(record, dict) and record.get("run_id") == run_id:
            return
        time.sleep(0.5)
