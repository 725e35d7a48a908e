"""One watchdog sidecar on every Ray node, placed by Ray itself.

Each is a detached actor pinned to its node (``NodeAffinitySchedulingStrategy``, ``soft=False``,
no CPU: it takes nothing the job asked for) that starts the ordinary sidecar process and ends
with it. Detached, it outlives the job's own actors and driver; pinned, it dies with its node:
the sidecar process gets SIGKILL when the actor's process ends (a raylet killed ends its
workers), so a lost node falls silent as a lost node does, and its peers report it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import open_append
from areal_watchdog.common.interprocess.parent import die_with_parent
from areal_watchdog.launch.planning.job import sidecar_command
from areal_watchdog.rundir.layout import ENV_RAYLET, ENV_RUN_ID

NAMESPACE = "areal-watchdog"
HEAD_RESOURCE = "node:__internal_head__"
START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RayNode:
    """A live node of the cluster, by the name the reports give it."""

    node_id: str
    name: str


def live_nodes(nodes: list[dict[str, Any]]) -> list[RayNode]:
    """``ray.nodes()`` as named nodes, the head first: Ray's node name (made unique with the
    node id's head when names repeat, as when raylets share a host under one IP)."""
    alive = [n for n in nodes if n.get("Alive")]
    alive.sort(key=lambda n: (HEAD_RESOURCE not in n.get("Resources", {}), n["NodeID"]))
    names = [str(n.get("NodeName") or n.get("NodeManagerAddress")) for n in alive]
    return [
        RayNode(n["NodeID"], name if names.count(name) == 1 else f"{name}-{n['NodeID'][:6]}")
        for n, name in zip(alive, names, strict=True)
    ]


def ray_sidecar_command(python: str, run_dir: str, node: str) -> list[str]:
    """The sidecar the driver places on one Ray node."""
    return sidecar_command(python, run_dir, "--node", node, "--ray")


class SidecarHost:
    """The actor: starts the sidecar process on its node, and exits when it ends."""

    def start(self, argv: list[str], out: str) -> int:
        """Start the sidecar from a thread that lives as long as it does (the kill on the
        actor's death is tied to the starting thread); its pid once started."""
        started: list[int] = []
        ready = threading.Event()
        env = {**os.environ, ENV_RAYLET: os.environ.get("RAY_RAYLET_PID", "")}

        def run() -> None:
            with open_append(Path(out)) as log:  # never a planted symlink
                proc = subprocess.Popen(
                    argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=lambda: die_with_parent(signal.SIGKILL),  # noqa: PLW1509
                )  # fmt: skip
            started.append(proc.pid)
            ready.set()
            proc.wait()
            os._exit(0)  # the actor ends with its sidecar: nothing of the run stays behind

        threading.Thread(target=run, daemon=True).start()
        ready.wait(timeout=START_TIMEOUT_S)
        return started[0] if started else -1


def place_sidecars(
    ray: Any, nodes: list[RayNode], run_id: str, python: str, run_dir: str, logs_dir: str
) -> dict[str, int]:
    """A sidecar on every node: {node name: sidecar pid}."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    host = ray.remote(SidecarHost)
    pending = {}
    for node in nodes:
        actor = host.options(
            name=f"sidecar-{run_id}-{node.name}", namespace=NAMESPACE, lifetime="detached",
            num_cpus=0, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
            runtime_env={"env_vars": {ENV_RUN_ID: ""}},  # the run's cleanup must not end it
        ).remote()  # fmt: skip
        argv = ray_sidecar_command(python, run_dir, node.name)
        out = os.path.join(logs_dir, f"sidecar_{node.name}.out")
        pending[node.name] = actor.start.remote(argv, out)
    return {name: ray.get(ref, timeout=START_TIMEOUT_S) for name, ref in pending.items()}
