"""The Ray job's driver on the head node: sidecars first, then AReaL's own command.

``areal-launch ray`` submits ``python -m areal_watchdog.launch.ray.driver --run-dir R -- CMD``
through Ray's Jobs API. This process connects to the cluster it runs in (``RAY_ADDRESS``, set
by Ray), waits for the nodes the run expects, names them in ``launch.json``, places a sidecar on
each (``sidecars``), then runs CMD (AReaL's Ray launcher, or the training script as the single
controller) with its output in ``logs/ray_driver.log`` as well, and records its end for every
node.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil

from areal_watchdog.common.atomic import open_append, write_json_atomic
from areal_watchdog.common.secrets.mask import Mask
from areal_watchdog.launch.ray.sidecars import NAMESPACE, RayNode, live_nodes, place_sidecars
from areal_watchdog.rundir.job_mask import job_mask
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import ENV_RAYLET, RunLayout

NODES_TIMEOUT_S = 120.0
# AReaL's Ray launcher ends a run whose trainer finished by raising JobException(COMPLETED)
# (its wait() treats COMPLETED like FAILED): the traceback's last line says so.
AREAL_COMPLETED = re.compile(r"JobException: Job \S+:trainer JobState\.COMPLETED\b")


def say(layout: RunLayout, message: str) -> None:
    """A line on the job's log and in the run's driver log (the launcher prints it)."""
    line = f"[areal-launch ray driver] {message}\n"
    sys.stdout.write(line)
    with open_append(layout.ray_driver_log) as log:
        log.write(line)


def wait_for_nodes(ray: object, expected: int) -> list[RayNode]:
    """The cluster's live nodes, once ``expected`` of them are up (a raylet joining late)."""
    deadline = time.monotonic() + NODES_TIMEOUT_S
    while True:
        nodes = live_nodes(ray.nodes())  # type: ignore[attr-defined]
        if len(nodes) >= expected or time.monotonic() > deadline:
            return nodes
        time.sleep(1.0)


def own_raylet() -> str | None:
    """The raylet of the node this driver runs on: Ray's job supervisor (an ancestor) carries
    its ``RAY_RAYLET_PID``; the entrypoint it starts does not."""
    for proc in psutil.Process().parents():
        with contextlib.suppress(psutil.Error):
            raylet = proc.environ().get("RAY_RAYLET_PID")
            if raylet:
                return raylet
    return None


def run_job(argv: list[str], log_path: Path, mask: Mask) -> int:
    """CMD to its end, its output masked on our stdout (Ray's job log) and in the run's log
    file; SIGTERM (Ray's stop_job) is passed on. A run AReaL's launcher ends as completed is 0."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
    signal.signal(signal.SIGINT, lambda *_: proc.send_signal(signal.SIGINT))
    completed = False
    with open_append(log_path) as log:
        for raw in iter(proc.stdout.readline, b""):  # type: ignore[union-attr]
            line = mask(raw.decode(errors="replace"))
            completed = completed or bool(AREAL_COMPLETED.search(line))
            sys.stdout.write(line)
            log.write(line)
            log.flush()
    return areal_exit(proc.wait(), completed)


def areal_exit(returncode: int, completed: bool) -> int:
    """The job's exit code: AReaL's JobException(COMPLETED) with exit 1 is a completed run."""
    return 0 if completed and returncode == 1 else returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m areal_watchdog.launch.ray.driver")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--nodes", type=int, default=1, help="nodes to wait for")
    parser.add_argument("--unwatched", action="store_true", help="no sidecars")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    info = LaunchInfo.load(args.run_dir)
    layout = info.layout
    import ray

    ray.init(namespace=NAMESPACE, log_to_driver=False)
    nodes = wait_for_nodes(ray, args.nodes)
    names = [n.name for n in nodes]
    say(layout, f"{len(nodes)} Ray node(s): {', '.join(names)}")
    if not args.unwatched:
        write_json_atomic(layout.launch_file, replace(info, nodes=names).to_dict())
        python = sys.executable
        pids = place_sidecars(ray, nodes, info.run_id, python, str(args.run_dir),
                              str(layout.logs_dir))  # fmt: skip
        say(layout, "sidecars: " + ", ".join(f"{n} (pid {pid})" for n, pid in pids.items()))
    ray.shutdown()  # AReaL's command is a driver of its own
    raylet = own_raylet()
    if raylet:  # the head's sidecar finds AReaL's controller by it
        os.environ[ENV_RAYLET] = raylet
    returncode = run_job(command, layout.ray_driver_log, job_mask(layout))
    record = {"run_id": info.run_id, "returncode": returncode, "time": time.time()}
    layout.job_exit_dir.mkdir(exist_ok=True)
    for name in names:
        write_json_atomic(layout.job_exit(name), record)
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
