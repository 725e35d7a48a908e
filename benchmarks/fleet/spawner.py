"""The real processes of ``bench_sidecars``, started from this one process so that a single
``strace -f`` follows them all: per real node, an agent (``--node``) that starts the node's
stand-in ranks (under our rank wrapper) and its sidecar (``--node``: the agent is its launcher).
With a network filesystem, each agent runs in a mount namespace of its own with its own client
mounted over the run root: one client a node, as on a cluster, not one cache for all.

Commands on stdin, one a line, relayed to the agents: ``kill-rank NODE`` (SIGKILL its first
rank), ``kill-node NODE`` (its sidecar and ranks), ``stick`` (every rank stops stepping: a
hang), ``end`` (every rank returns), ``quit``. The pids go to ``SPEC.pids.json``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

RANK = Path(__file__).resolve().parent / "standin_rank.py"
SIGNALS = {"stick": signal.SIGUSR2, "end": signal.SIGUSR1}


def agent(spec: dict, node: str) -> int:
    """One node: its client of the network filesystem (if any), its ranks, its sidecar."""
    if spec.get("mount"):
        subprocess.run(spec["mount"], check=True)
    index = spec["nodes"].index(node)
    python, run_dir = spec["python"], spec["run_dir"]
    env = {**os.environ, **spec["env"], "AREAL_WATCHDOG_NODE": node}
    ranks = []
    for local in range(spec["ranks_per_node"]):
        rank = index * spec["ranks_per_node"] + local
        out = open(spec["rank0_log"], "a") if rank == 0 else subprocess.DEVNULL  # noqa: SIM115
        rank_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(local),
                    "WORLD_SIZE": str(spec["world_size"])}  # fmt: skip
        argv = [python, "-m", "areal_watchdog.rank.main", str(RANK)]
        ranks.append(subprocess.Popen(argv, env=rank_env, stdout=out, stderr=out))
    log = open(Path(spec["logs"]) / f"sidecar_{node}.log", "w")  # noqa: SIM115
    argv = [python, "-m", "areal_watchdog.watch.sidecar", "--run-dir", run_dir, "--node", node]
    sidecar = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
    print(json.dumps({"sidecar": sidecar.pid, "ranks": [r.pid for r in ranks]}), flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "kill-rank":
            _signal(ranks[:1], signal.SIGKILL)
        elif command == "kill-node":
            _signal([sidecar, *ranks], signal.SIGKILL)
        elif command in SIGNALS:
            _signal(ranks, SIGNALS[command])
        elif command == "quit":
            break
        print("done", flush=True)
    _signal([sidecar, *ranks], signal.SIGKILL)
    if spec.get("mount"):
        subprocess.run(["umount", "-l", spec["mount_point"]], check=False)
    return 0


def _signal(processes: list[subprocess.Popen], sig: int) -> None:
    """Signal each; reap those killed (as torchrun and srun reap theirs)."""
    for proc in processes:
        if proc.poll() is None:
            proc.send_signal(sig)
    if sig == signal.SIGKILL:
        for proc in processes:
            proc.wait()


def main() -> int:
    spec_path = Path(sys.argv[1])
    spec = json.loads(spec_path.read_text())
    if len(sys.argv) > 3 and sys.argv[2] == "--node":
        return agent(spec, sys.argv[3])
    unshare = ["unshare", "--mount", "--propagation", "private"] if spec.get("mount") else []
    agents = {
        node: subprocess.Popen(
            [*unshare, sys.executable, __file__, str(spec_path), "--node", node],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for node in spec["nodes"]
    }
    started = {node: json.loads(a.stdout.readline()) for node, a in agents.items()}  # type: ignore[union-attr]
    pids = {"sidecars": {n: s["sidecar"] for n, s in started.items()},
            "ranks": {n: s["ranks"] for n, s in started.items()}}  # fmt: skip
    Path(f"{spec_path}.pids.json").write_text(json.dumps(pids))
    for line in sys.stdin:
        command, _, node = line.strip().partition(" ")
        for name, proc in agents.items():
            if node in ("", name):
                _tell(proc, command)
        if command == "quit":
            break
        print(f"done {command}", flush=True)
    for proc in agents.values():
        proc.wait(timeout=60)
    return 0


def _tell(proc: subprocess.Popen, command: str) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    if command != "quit":
        proc.stdout.readline()


if __name__ == "__main__":
    sys.exit(main())
