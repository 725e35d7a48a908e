"""What runs on every node of a Slurm job, as the submitit task (one per node).

It starts torchrun for this node's ranks (``--nnodes``, ``--node-rank``, rendezvous on the first
node's address), records how it ended for the sidecars, and gives the watchdog a bounded moment
to write its final report before the step ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from areal_watchdog.common.atomic import read_json, write_json_atomic
from areal_watchdog.launch.torchrun import multi_node, torchrun_command
from areal_watchdog.rundir.layout import ENV_NODE, RunLayout

SIDECAR_FINISH_WAIT = 30.0  # seconds to wait for the leading sidecar's final word


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
        return self.command(
            "$SLURMD_NODENAME", "$SLURM_NODEID", n_nodes, "$FIRST_NODE_ADDR", "$RENDEZVOUS_PORT"
        )


def slurm_nodes() -> list[str]:
    """The job's node names in Slurm's order."""
    out = subprocess.run(
        ["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def node_address(node: str) -> str:
    """The address Slurm knows a node by (``NodeAddr``), for the rendezvous."""
    out = subprocess.run(
        ["scontrol", "show", "node", node], capture_output=True, text=True, check=False
    )
    for word in out.stdout.split():
        if word.startswith("NodeAddr="):
            return word.split("=", 1)[1]
    return node


def rendezvous_port(job_id: str) -> int:
    return 20_000 + int(job_id) % 20_000


def run_node(job: NodeJob) -> int:
    """Run this node's torchrun to its end; raise on failure so Slurm sees it."""
    node = os.environ["SLURMD_NODENAME"]
    nodes = slurm_nodes()
    layout = RunLayout(Path(job.run_dir))
    port = rendezvous_port(os.environ["SLURM_JOB_ID"])
    cmd = job.command(node, str(nodes.index(node)), len(nodes), node_address(nodes[0]), str(port))
    env = {**os.environ, **job.env, ENV_NODE: node}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):  # submitit's own, not torchrun's
        env.pop(name, None)
    print(f"[areal-launch {node}] {' '.join(cmd)}", flush=True)
    proc = subprocess.Popen(cmd, env=env, stdout=sys.stdout, stderr=sys.stderr)
    returncode = proc.wait()
    layout.job_exit_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        layout.job_exit(node),
        {"run_id": job.run_id, "node": node, "returncode": returncode, "time": time.time()},
    )
    if job.watchdog:
        _wait_for_report(layout, job.run_id)
    if returncode != 0:
        raise RuntimeError(f"torchrun on {node} exited with code {returncode}")
    return returncode


def _wait_for_report(layout: RunLayout, run_id: str) -> None:
    """Give the leading sidecar time to conclude (and report a failure) before the step ends:
    when this task returns, Slurm ends the job and with it the sidecars."""
    deadline = time.monotonic() + SIDECAR_FINISH_WAIT
    while time.monotonic() < deadline:
        record = read_json(layout.finished_file)
        if isinstance(record, dict) and record.get("run_id") == run_id:
            return
        time.sleep(0.5)
