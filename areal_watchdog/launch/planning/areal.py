"""AReaL's own launch modes, run the way AReaL's docs run them, with the watchdog wired in
through AReaL's own mechanisms (read in AReaL 1.0.4; docs/areal.md):

- **single controller** (``python3 train.py --config cfg scheduler.type=local``): the training
  script runs as one plain process, not under torchrun; AReaL's scheduler starts every worker
  (``rpc_server``), the workers start the inference servers and fork more workers. Each inherits
  the controller's environment (the local scheduler passes it whole, its ``PYTHONPATH`` included),
  so the debug variables, the run id and our ``sitecustomize`` reach every process of the job.
- **SPMD** (what ``python -m areal.infra.launcher.local train.py --config cfg`` does): start the
  inference servers with AReaL's own server launcher, wait until they are registered in
  name_resolve, then torchrun with ``AREAL_SPMD_MODE=1`` and ``AREAL_LLM_SERVER_ADDRS``. We run
  these three steps ourselves rather than AReaL's launcher: its shell command breaks on a machine
  without GPUs (an empty device variable becomes ``=0``), and our ranks run under our wrapper.

AReaL starts inference servers as a bare ``python3`` from ``PATH``: the interpreter's folder goes
first on ``PATH`` so that every process runs the same Python.
"""

from __future__ import annotations

import getpass
import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from areal_watchdog.common.errors import ConfigError
from areal_watchdog.config.areal_side.areal import Allocation, parse_allocation
from areal_watchdog.config.areal_side.entrypoint import resolve_entrypoint
from areal_watchdog.config.model import JobConfig
from areal_watchdog.launch.planning.plan import Gate, ProcessSpec
from areal_watchdog.launch.planning.torchrun import standalone, torchrun_command
from areal_watchdog.rank.sitehook import DIRECTORY as SITEHOOK
from areal_watchdog.rundir.layout import ENV_JOB_CONFIG, ENV_RANK_ROLE, ENV_RUN_ID, RunLayout
from areal_watchdog.trajectory.format import ENV_REPLAY_DIR

AREAL_NAME_RESOLVE_ROOT = "/tmp/areal/name_resolve"  # AReaL's default nfs_record_root
SLURM_NODE = "$SLURMD_NODENAME"  # the node a Slurm plan is made for: each, as Slurm says
RANK_ROLE = "actor"  # single controller: the role whose workers form the training world
SERVER_WAIT_S = 1200.0  # AReaL's own wait for its inference servers (wait_llm_server_addrs)
SPMD_TRAINER_ENV = {"AREAL_SPMD_MODE": "1", "NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}
SERVER_LAUNCHERS = {
    "sglang": "areal.infra.launcher.sglang_server",
    "vllm": "areal.infra.launcher.vllm_server",
}


@dataclass
class ArealJob:
    """What a launch of an AReaL experiment adds to the plan."""

    processes: list[ProcessSpec]
    tree: dict[str, Any]  # the config AReaL reads (our sections removed, AReaL's edits made)
    world_size: int
    rank_role: str | None
    dirs: list[str] = field(default_factory=list)  # AReaL refuses to start without them
    reset_paths: list[str] = field(default_factory=list)  # this trial's stale name_resolve


def plan_areal(
    config: JobConfig, mode: str, backend: str, layout: RunLayout, env: dict[str, str],
    rank_command: list[str], node: str,
) -> ArealJob:  # fmt: skip
    """The processes and config edits of a ``single_controller`` or ``spmd`` launch."""
    tree = config.job_tree()
    cluster = tree.setdefault("cluster", {})
    cluster["fileroot"] = config.fileroot  # AReaL's default differs from ours
    records = _name_resolve_root(config, cluster)
    actor = _allocation(config, tree, "actor")
    if ENV_RUN_ID in env:
        env = {**env, **areal_environment(layout, config.launch.python, env)}
    else:  # not watched: no hook, no controller mark; the interpreter's folder first on PATH
        env = {**env, "PATH": areal_environment(layout, config.launch.python, env)["PATH"]}
    if mode == "single_controller":
        _set_scheduler(config, tree, backend)
        if ENV_RUN_ID in env:
            env[ENV_RANK_ROLE] = RANK_ROLE
        controller = ProcessSpec(
            "controller", script_command(config, layout), env,
            log=str(layout.logs_dir / f"controller_{node}.log"),
        )  # fmt: skip
        return ArealJob([controller], tree, actor.world_size, RANK_ROLE, [records])
    rollout = _allocation(config, tree, "rollout")
    tree.setdefault("allocation_mode", f"{tree['rollout']['backend']}+{tree['actor']['backend']}")
    trial = Path(records) / getpass.getuser() / config.experiment_name / config.trial_name
    processes = _spmd_processes(config, layout, env, rank_command, rollout, actor, trial, node)
    return ArealJob(processes, tree, actor.world_size, None, [records], [str(trial)])


def areal_environment(layout: RunLayout, python: str, env: dict[str, str]) -> dict[str, str]:
    """What every process of an AReaL job gets: our ``sitecustomize`` on ``PYTHONPATH`` (AReaL
    passes the controller's path on to its workers), the interpreter's folder first on ``PATH``,
    and the config path that marks the controller."""
    base = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    folder = os.path.dirname(shutil.which(python) or python)
    return {
        "PYTHONPATH": os.pathsep.join(p for p in (SITEHOOK, base) if p),
        "PATH": os.pathsep.join(p for p in (folder, env.get("PATH", os.environ["PATH"])) if p),
        ENV_JOB_CONFIG: str(layout.job_config),
    }


def script_command(config: JobConfig, layout: RunLayout) -> list[str]:
    """``python train.py ARGS --config JOB_CONFIG``, as AReaL's docs run a training script."""
    entry = resolve_entrypoint(config)
    script = [entry] if entry.endswith(".py") else ["-m", entry]
    config_arg = [config.launch.config_arg or "--config", str(layout.job_config)]
    return [config.launch.python, *script, *config.launch.args, *config_arg]


def _spmd_processes(
    config: JobConfig, layout: RunLayout, env: dict[str, str], rank_command: list[str],
    rollout: Allocation, actor: Allocation, trial: Path, node: str,
) -> list[ProcessSpec]:  # fmt: skip
    """AReaL's SPMD launcher's steps: the server launcher, then torchrun once they registered."""
    module = SERVER_LAUNCHERS.get(rollout.backend)
    if module is None:
        known = ", ".join(SERVER_LAUNCHERS)
        message = f"SPMD needs an inference backend of {known}, got {rollout.backend!r}"
        raise ConfigError(config.source, "rollout.backend", message)
    logs = _areal_logs(config)
    gen_devices = rollout.world_size
    server_env = dict(env)
    trainer_env = {**env, **SPMD_TRAINER_ENV}
    if config.n_gpus_per_node and node != SLURM_NODE:  # one node: servers first, then ranks
        server_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(gen_devices)))
        trainer_env["CUDA_VISIBLE_DEVICES"] = ",".join(
            map(str, range(gen_devices, gen_devices + actor.world_size))
        )
    trainer = ProcessSpec(
        "trainer",
        torchrun_command(config.launch.python, layout, node, actor.world_size, standalone(),
                         rank_command),
        trainer_env, log=str(logs / "trainer.log"),
    )  # fmt: skip
    if ENV_REPLAY_DIR in env:  # a replay: the dumped batches stand in for every server
        return [trainer]
    entry = script_command(config, layout)[1:]
    servers = ProcessSpec(
        "inference-servers",
        [config.launch.python, "-m", module, *entry, f"++cluster.n_gpus_per_node={gen_devices}"],
        server_env, kind="service", log=str(logs / "llm_server.log"),
    )  # fmt: skip
    gate = Gate(str(trial / "gen_servers"), rollout.dp, SERVER_WAIT_S, "AREAL_LLM_SERVER_ADDRS")
    return [servers, replace(trainer, after=gate)]


def _areal_logs(config: JobConfig) -> Path:
    """AReaL's log directory for the trial: ``<fileroot>/logs/<user>/<experiment>/<trial>``."""
    return (
        Path(config.fileroot)
        / "logs"
        / getpass.getuser()
        / config.experiment_name
        / (config.trial_name)
    )


def _name_resolve_root(config: JobConfig, cluster: dict[str, Any]) -> str:
    resolve = cluster.get("name_resolve") or {}
    if resolve.get("type", "nfs") != "nfs":
        message = (
            "areal-launch reads AReaL's name_resolve records from the shared filesystem: use "
            f"nfs, got {resolve.get('type')!r}"
        )
        raise ConfigError(config.source, "cluster.name_resolve.type", message)
    return str(resolve.get("nfs_record_root") or AREAL_NAME_RESOLVE_ROOT)


def _allocation(config: JobConfig, tree: dict[str, Any], engine: str) -> Allocation:
    spec = (tree.get(engine) or {}).get("backend")
    allocation = parse_allocation(spec) if isinstance(spec, str) else None
    if allocation is None or not allocation.backend:
        message = f"needs an allocation like 'fsdp:d2' or 'sglang:d1t2', got {spec!r}"
        raise ConfigError(config.source, f"{engine}.backend", message)
    return allocation


def _set_scheduler(config: JobConfig, tree: dict[str, Any], backend: str) -> None:
    """``scheduler.type`` is the backend we launch on (AReaL's shipped configs say null)."""
    scheduler = tree.setdefault("scheduler", {}) or {}
    tree["scheduler"] = scheduler
    chosen = scheduler.get("type")
    if chosen not in (None, backend):
        message = f"is {chosen!r} but this is `areal-launch {backend}`: set {backend} or null"
        raise ConfigError(config.source, "scheduler.type", message)
    scheduler["type"] = backend
