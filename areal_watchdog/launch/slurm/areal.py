"""AReaL's two modes on Slurm.

**Single controller**, the way AReaL's docs run it: the training script runs here (on the login
node) with ``scheduler.type=slurm``, and AReaL's Slurm scheduler submits one job per role
(``<experiment>_<trial>:<role>``), one ``srun`` task per worker.

The watchdog rides on AReaL's own mechanisms:

- the environment: AReaL's ``sbatch`` passes the controller's whole environment on (no
  ``--export``), and its workers get the controller's ``PYTHONPATH`` (``--env`` of the container
  command): the run id, the debug variables and our ``sitecustomize`` reach every worker;
- the sidecars: every engine's ``scheduling_spec[*].additional_bash_cmds`` (run by every task,
  before the worker) starts ``sidecar --standby``: the first on a node takes the node's lock and
  watches, the others wait and take over when its task ends; each ends with its own task. They
  join the controller host's sidecar, which leads (``LaunchInfo.dynamic_nodes``).

AReaL cancels its jobs only from ``trainer.close()``: when the controller ends any other way
(a cancel after a hang, Ctrl-C), ``execute`` cancels every job named after the trial.

**SPMD**, as AReaL's ``areal.infra.launcher.slurm`` does it, in one job instead of two: the
first nodes run AReaL's server launcher, the others wait until the servers registered in
name_resolve, then run torchrun with ``AREAL_SPMD_MODE=1`` (``spmd_shape``). One job, one
sidecar per node, one report, one ``scancel``.
"""

from __future__ import annotations

import copy
import shlex
import socket
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, TextIO

from areal_watchdog.common.errors import ConfigError
from areal_watchdog.config.areal_side.areal import parse_allocation
from areal_watchdog.config.model import JobConfig
from areal_watchdog.launch.local import LocalBackend
from areal_watchdog.launch.planning.areal import SLURM_NODE, plan_areal
from areal_watchdog.launch.planning.job import (
    job_environment,
    launch_files,
    sidecar_command,
    stale_state,
)
from areal_watchdog.launch.planning.plan import LaunchPlan, ProcessSpec
from areal_watchdog.launch.slurm.control.jobs import cancel_jobs
from areal_watchdog.launch.slurm.node import ServerNodes
from areal_watchdog.launch.slurm.options import validate_slurm
from areal_watchdog.launch.slurm.scheduler_command import scheduler_command
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import RunLayout


def plan_single_controller(config: JobConfig, watchdog: bool, run_id: str | None) -> LaunchPlan:
    """The controller and its sidecar here; AReaL's jobs carry the standby sidecars."""
    run_id = run_id or uuid.uuid4().hex[:12]
    layout = RunLayout(config.run_dir.resolve())
    host = socket.gethostname()
    env = job_environment(config, layout, run_id, host, watchdog)
    job = plan_areal(config, "single_controller", "slurm", layout, env, [], host)
    notes = [f"AReaL's jobs: {job_prefix(config)}<role> (one per role, cancelled with the run)"]
    if not job.tree["cluster"].get("n_gpus_per_node"):
        job.tree["cluster"]["n_gpus_per_node"] = 1  # AReaL's scheduler divides by it
        notes.append("cluster.n_gpus_per_node: 1 for AReaL (its Slurm scheduler divides by it)")
    excluded = validate_slurm(config).get("exclude")
    if excluded:
        _exclude_nodes(job.tree, excluded)
        notes.append(f"AReaL's jobs exclude node(s) {excluded} (launch.slurm.exclude)")
    if watchdog:
        _add_standby_sidecars(job.tree, config.launch.python, layout)
        line = standby_command(config.launch.python, layout)
        notes.append(f"every task of AReaL's jobs runs first (additional_bash_cmds): {line}")
    info = LaunchInfo.for_config(
        config, run_id, "slurm", layout.run_dir, job.world_size, [host], "single_controller",
        job.rank_role,
    )  # fmt: skip
    info = replace(  # the ranks run elsewhere, in AReaL's jobs
        info, nproc_per_node=0, dynamic_nodes=True,
        scheduler_command=scheduler_command(config.launch.python),
    )  # fmt: skip
    processes = list(job.processes)
    if watchdog:
        sidecar = sidecar_command(config.launch.python, layout.run_dir, "--node", host)
        processes.append(ProcessSpec("watchdog", sidecar, kind="watchdog"))
    return LaunchPlan(
        backend="slurm",
        run_id=run_id,
        run_dir=str(layout.run_dir),
        files=launch_files(config, info, watchdog, job.tree),
        processes=processes,
        reset_paths=[str(p) for p in stale_state(layout)],
        dirs=job.dirs,
        notes=notes,
        payload=job_prefix(config),
        dir_mode=config.launch.run_dir_mode,
        mode="single_controller",
    )


@dataclass
class SpmdShape:
    """How an SPMD experiment spreads over the job's nodes."""

    servers: ServerNodes
    trainer_env: dict[str, str]
    nproc_per_node: int
    world_size: int
    tree: dict[str, Any]
    dirs: list[str]
    reset_paths: list[str]


def spmd_shape(
    config: JobConfig, layout: RunLayout, env: dict[str, str], ranks: list[str]
) -> SpmdShape:
    """Server nodes first (enough for the rollout allocation), then the trainer's nodes."""
    job = plan_areal(config, "spmd", "slurm", layout, env, ranks, SLURM_NODE)
    servers, trainer = job.processes
    rollout = parse_allocation(job.tree["rollout"]["backend"])
    per_node = max(1, config.n_gpus_per_node)
    count = -(-(rollout.world_size if rollout else 1) // per_node)
    trainers = config.n_nodes - count
    if trainers < 1 or job.world_size % trainers:
        raise ConfigError(
            config.source, "cluster.n_nodes", f"is {config.n_nodes}: SPMD needs {count} node(s) "
            f"for the inference servers, then nodes sharing the trainer's {job.world_size} "
            f"rank(s) evenly; try cluster.n_nodes={count + 1}",
        )  # fmt: skip
    assert trainer.after is not None  # plan_areal's SPMD trainer always waits for the servers
    return SpmdShape(
        ServerNodes(count, servers.argv, servers.env, trainer.after),
        trainer.env, job.world_size // trainers, job.world_size, job.tree, job.dirs,
        job.reset_paths,
    )  # fmt: skip


def execute_single_controller(plan: LaunchPlan, out: TextIO = sys.stdout) -> int:
    """Run the controller here as the local backend does, then cancel what AReaL left."""
    try:
        return LocalBackend().execute(plan, out)
    finally:
        left = cancel_jobs(str(plan.payload))
        if left:
            print(f"[areal-launch] cancelled AReaL's Slurm jobs: {', '.join(left)}", file=out)


def job_prefix(config: JobConfig) -> str:
    """AReaL names each role's job ``<experiment>_<trial>:<role>``."""
    return f"{config.experiment_name}_{config.trial_name}:"


def standby_command(python: str, layout: RunLayout) -> str:
    """The line every task of AReaL's jobs runs first: a standby sidecar in the background, its
    output in the run's logs (AReaL joins these lines with ``;``: the braces keep ``&`` legal)."""
    sidecar = sidecar_command(python, layout.run_dir, "--node-from-scheduler", "--standby")
    log = f"{shlex.quote(str(layout.logs_dir))}/sidecar_$SLURMD_NODENAME.out"
    return f"{{ {shlex.join(sidecar)} >> {log} 2>&1 < /dev/null & }}"


def _scheduling_specs(tree: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every engine's scheduling specs, copied into the tree first (the config stays as
    written); colocated roles submit no job and ignore theirs."""
    for section in tree.values():
        specs = section.get("scheduling_spec") if isinstance(section, dict) else None
        if isinstance(specs, list):
            section["scheduling_spec"] = specs = copy.deepcopy(specs)
            yield from (spec for spec in specs if isinstance(spec, dict))


def _exclude_nodes(tree: dict[str, Any], nodes: str) -> None:
    """``launch.slurm.exclude`` (a resume adds the nodes a hang named) joins each spec's own
    ``exclude``, which AReaL's scheduler passes to sbatch."""
    for spec in _scheduling_specs(tree):
        names = {n for n in f"{spec.get('exclude') or ''},{nodes}".split(",") if n}
        spec["exclude"] = ",".join(sorted(names))


def _add_standby_sidecars(tree: dict[str, Any], python: str, layout: RunLayout) -> None:
    """Every engine's scheduling specs run the standby sidecar first (AReaL's
    ``additional_bash_cmds``, once per task)."""
    line = standby_command(python, layout)
    for spec in _scheduling_specs(tree):
        spec["additional_bash_cmds"] = [*(spec.get("additional_bash_cmds") or []), line]
