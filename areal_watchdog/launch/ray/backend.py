"""The Ray backend: AReaL's experiment as a Ray job, a sidecar on every Ray node.

``plan`` builds the LaunchPlan: the cluster (an existing one's Jobs API, or ``ray start`` for a
cluster of this machine's own), the driver the Jobs API runs on the head (``driver``: sidecars
first, then AReaL's Ray launcher, SPMD) and the environment every Ray worker of the
job gets (the job's ``runtime_env``: Ray merges it into each task's and actor's own).
``execute`` runs that plan (``run``). Single controller: the driver runs the training script,
connected to Ray first (``rank.ray.ray_controller``), and AReaL's ``RayScheduler`` places the
workers.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from areal_watchdog.common.errors import ConfigError
from areal_watchdog.config.areal_side.entrypoint import launch_mode, resolve_entrypoint
from areal_watchdog.config.model import JobConfig
from areal_watchdog.launch.planning.areal import areal_environment, plan_areal, script_command
from areal_watchdog.launch.planning.job import (
    job_environment,
    launch_files,
    rank_command,
    stale_state,
)
from areal_watchdog.launch.planning.plan import LaunchPlan, ProcessSpec
from areal_watchdog.launch.ray import handle
from areal_watchdog.launch.ray.cluster import OwnCluster
from areal_watchdog.launch.ray.run import RayRun
from areal_watchdog.launch.ray.sidecars import ray_sidecar_command
from areal_watchdog.launch.ray.submission import RaySubmission
from areal_watchdog.launch.recovery import Recovery
from areal_watchdog.launch.run_handle import Described, KnownByRunDir
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import RunLayout

DRIVER_MODULE = "areal_watchdog.launch.ray.driver"
TORCHRUN_REFUSED = (
    "the ray backend runs AReaL experiments: set single_controller (AReaL's RayScheduler) or "
    "spmd (AReaL's Ray launcher)"
)
SPMD_LAUNCHER = "areal.infra.launcher.ray"  # AReaL's Ray launcher (SPMD)
CONTROLLER_MODULE = "areal_watchdog.rank.ray.ray_controller"  # ray.init(), then the script


class RayRecovery(Recovery):
    """A resume is not on Ray yet."""

    def refusal(self, config: JobConfig, mode: str) -> str | None:
        return (
            "watchdog.on_hang: resume is not on the ray backend yet; use on_hang: cancel (or "
            "report) there"
        )


class RayBackend(KnownByRunDir):
    """A Ray job through the Jobs API; the driver places the sidecars."""

    name = "ray"
    run_note = " (Ray run)"
    recovery = RayRecovery()

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """No options of its own."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RayBackend:
        return cls()

    def plan(self, config: JobConfig, watchdog: bool, run_id: str | None = None) -> LaunchPlan:
        """Plan a Ray launch; raises ConfigError before anything starts."""
        mode = launch_mode(config)
        if mode == "torchrun":
            raise ConfigError(config.source, "launch.mode", TORCHRUN_REFUSED)
        run_id = run_id or uuid.uuid4().hex[:12]
        layout = RunLayout(config.run_dir.resolve())
        python = config.launch.python
        env = job_environment(config, layout, run_id, None, watchdog)
        job = plan_areal(config, mode, self.name, layout, env,
                         rank_command(config, layout, watchdog), "ray")  # fmt: skip
        env = {**env, **areal_environment(layout, python, env)} if watchdog else env
        if mode == "single_controller":  # the controller's: which role holds the ranks
            env = job.processes[0].env
        cluster, address, nodes = _cluster(config, run_id)
        info = LaunchInfo.for_config(
            config, run_id, self.name, layout.run_dir, job.world_size, nodes, mode, job.rank_role
        )
        submission = RaySubmission(address, cluster, f"areal-watchdog-{run_id}", python)
        info = replace(
            info, step_logs=[str(layout.ray_driver_log)],  # what Ray forwards
            job_id=submission.submission_id, job_address=address,
        )  # fmt: skip
        processes = _processes(config, layout, env, cluster, len(nodes) or 1, watchdog, mode)
        return LaunchPlan(
            backend=self.name, run_id=run_id, run_dir=str(layout.run_dir),
            files=launch_files(config, info, watchdog, job.tree), processes=processes,
            reset_paths=[str(p) for p in stale_state(layout)] + job.reset_paths,
            dirs=job.dirs, payload=submission, dir_mode=config.launch.run_dir_mode, mode=mode,
            notes=_notes(submission, watchdog),
        )  # fmt: skip

    def execute(self, plan: LaunchPlan, out: TextIO = sys.stdout) -> int:
        """Run the plan to the end and return areal-launch's exit code."""
        return RayRun(plan, out).run()

    @classmethod
    def describe(cls, target: str) -> Described:
        return handle.describe(target, cls.run_note)

    @classmethod
    def cancel(cls, target: str) -> str:
        return handle.cancel(target)

    def release(self) -> None:
        """Nothing outlives a run here."""


def _processes(
    config: JobConfig, layout: RunLayout, env: dict[str, str], cluster: OwnCluster | None,
    nodes: int, watchdog: bool, mode: str,
) -> list[ProcessSpec]:  # fmt: skip
    """The own cluster's raylets, the driver (AReaL's Ray launcher or the training script after
    it), the sidecars."""
    python = config.launch.python
    processes = [
        ProcessSpec(f"ray start ({name})", argv, kind="cluster")
        for name, argv in zip(cluster.node_names(), cluster.commands(python), strict=True)
    ] if cluster else []  # fmt: skip
    module = SPMD_LAUNCHER if mode == "spmd" else CONTROLLER_MODULE
    areal = [python, "-m", module, *script_command(config, layout)[1:]]
    driver = [python, "-m", DRIVER_MODULE, "--run-dir", str(layout.run_dir), "--nodes", str(nodes)]
    driver += [] if watchdog else ["--unwatched"]
    entry = resolve_entrypoint(config)
    cwd = str(Path(entry).parent) if entry.endswith(".py") else None
    processes.append(ProcessSpec("job", [*driver, "--", *areal], env, cwd=cwd))
    if watchdog:
        sidecar = ray_sidecar_command(python, str(layout.run_dir), "<each Ray node>")
        processes.append(ProcessSpec("watchdog", sidecar, kind="watchdog"))
    return processes


def _cluster(config: JobConfig, run_id: str) -> tuple[OwnCluster | None, str, list[str]]:
    """The own cluster (None on an existing one), the Jobs API's URL, the nodes known now (an
    existing cluster's are named by the driver once it runs)."""
    address = config.launch.ray.address or os.environ.get("RAY_ADDRESS")
    if address:
        if not address.startswith(("http://", "https://")):
            message = f"RAY_ADDRESS must be the Jobs API's URL (http://HEAD:8265), got {address!r}"
            raise ConfigError(config.source, "launch.ray.address", message)
        return None, address, []
    nodes = config.launch.ray.nodes or config.n_nodes
    cluster = OwnCluster.plan(config.launch.ray, nodes, run_id)
    return cluster, cluster.address, cluster.node_names()


def _notes(submission: RaySubmission, watchdog: bool) -> list[str]:
    where = (
        f"a Ray cluster of this machine's own ({submission.cluster.nodes} raylets on 127.0.0.1, "
        f"temp dir {submission.cluster.temp_dir}), ended with the run"
        if submission.cluster
        else f"the Ray cluster at {submission.address}"
    )
    notes = [
        f"submitted to {where} as Ray job {submission.submission_id}; the job's environment is "
        "its runtime_env (every task and actor of it gets it)"
    ]
    if watchdog:
        notes.append(
            "the driver places one sidecar per Ray node: a detached actor pinned to the node "
            "(node affinity, 0 CPU) that runs the sidecar command above"
        )
    return notes
