"""What every backend starts the same way: the ranks' environment, the command torchrun runs on
every rank, the files the run directory gets, and the stale state an earlier launch left."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from areal_watchdog.common.atomic import write_text_atomic
from areal_watchdog.common.roles import SIDECAR_MODULE
from areal_watchdog.common.secrets.mask import ENV_MASKED
from areal_watchdog.common.secrets.redact import REDACTED, SECRET_NAME, Redactor
from areal_watchdog.config.areal_side.entrypoint import resolve_entrypoint
from areal_watchdog.config.debug_env import render_debug_env
from areal_watchdog.config.model import JobConfig
from areal_watchdog.launch.planning.plan import LaunchPlan
from areal_watchdog.rank.flight_recorder import ENV_FLIGHT_RECORDER
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import ENV_NODE, ENV_RUN_ID, ENV_WATCH_DIR, RunLayout
from areal_watchdog.rundir.lock import hold_run_lock
from areal_watchdog.rundir.secure import ensure_run_dir
from areal_watchdog.trajectory import format as trajectory


def job_environment(
    config: JobConfig, layout: RunLayout, run_id: str, node: str | None, watchdog: bool
) -> dict[str, str]:
    """The variables every rank gets on top of the launcher's environment (``node``: None when
    each node adds its own name, as on Slurm)."""
    env: dict[str, str] = {}
    if watchdog:
        env.update(_watch_environment(config, layout, run_id))
        if node is not None:
            env[ENV_NODE] = node
    env.update(config.launch.env)
    masked = masked_names(config.launch.env)
    if masked:
        env[ENV_MASKED] = ",".join(masked)
    return env


def _watch_environment(config: JobConfig, layout: RunLayout, run_id: str) -> dict[str, str]:
    wd = config.watchdog
    env = render_debug_env(wd.debug_env, str(layout.watch_dir))
    env.update(
        {
            ENV_RUN_ID: run_id,
            ENV_WATCH_DIR: str(layout.watch_dir),
            trajectory.ENV_CONFIG_HASH: trajectory.config_hash(config.raw),
        }
    )
    if wd.flight_recorder:
        env[ENV_FLIGHT_RECORDER] = "1"
    if wd.trajectory.enabled:
        env[trajectory.ENV_DIR] = str(config.trajectory_dir)
        env[trajectory.ENV_MAX_KEEP] = str(wd.trajectory.max_keep)
        env[trajectory.ENV_PIN_STEPS] = ",".join(map(str, wd.trajectory.pin_steps))
        if wd.trajectory.dump_steps is not None:
            env[trajectory.ENV_DUMP_STEPS] = ",".join(map(str, wd.trajectory.dump_steps))
    return env


def rank_command(config: JobConfig, layout: RunLayout, watchdog: bool) -> list[str]:
    """What torchrun starts on every rank: the entrypoint, wrapped when watched."""
    entry = resolve_entrypoint(config)
    tail = [entry, *config.launch.args]
    if config.launch.config_arg:
        tail += [config.launch.config_arg, str(layout.job_config)]
    if watchdog:
        return ["-m", "areal_watchdog.rank.main", *tail]
    return tail if entry.endswith(".py") else ["-m", *tail]


def sidecar_command(python: str, run_dir: str | Path, *where: str) -> list[str]:
    """The one command line of a sidecar; ``where``: ``--node NODE`` (and ``--ray``), or
    ``--node-from-scheduler`` (and ``--standby``)."""
    return [python, "-m", SIDECAR_MODULE, "--run-dir", str(run_dir), *where]


def launch_files(
    config: JobConfig, info: LaunchInfo, watchdog: bool, tree: dict[str, Any] | None = None
) -> dict[str, str]:
    """launch.json for the sidecars, the resolved config for the training script (``tree``:
    already edited for AReaL), and the whole resolved config (our sections included) from which
    ``areal-launch replay`` starts again."""
    layout = info.layout
    dumping = watchdog and config.watchdog.trajectory.enabled
    job_tree = tree if tree is not None else config.job_tree(dumping)
    return {
        str(layout.launch_file): json.dumps(info.to_dict(), indent=1, sort_keys=True),
        str(layout.job_config): yaml.safe_dump(job_tree, sort_keys=False),
        str(layout.launch_config): stored_config(config),
    }


def stored_config(config: JobConfig) -> str:
    """The whole resolved config (our sections included) as a run directory keeps it, the
    script's path resolved and ``launch.env``'s secrets left out: what ``replay`` and
    ``check-consistency`` start from."""
    raw = dict(config.raw)
    raw["launch"] = {
        **raw.get("launch", {}),
        "entrypoint": resolve_entrypoint(config),
        "env": stored_env(config.launch.env),
    }
    return yaml.safe_dump(raw, sort_keys=False)


def stored_env(env: dict[str, str]) -> dict[str, str]:
    """``launch.env`` as the run directory keeps it: a secret's value is never written; a replay
    takes it from its own environment."""
    secret = set(masked_names(env))
    return {name: REDACTED if name in secret else value for name, value in env.items()}


def masked_names(env: dict[str, str]) -> list[str]:
    """The ``launch.env`` variables that hold secrets: a secret-looking name, or a value that
    looks like a token. Their values are never stored, and masked in the job's output."""
    clean = Redactor()
    return [n for n, v in env.items() if SECRET_NAME.search(n) or clean.scrub(v) != v]


def stale_state(layout: RunLayout) -> list[Path]:
    """What an earlier launch of the same run directory leaves that must not confuse this one."""
    watch = layout.watch_dir
    return [
        layout.ranks_dir,
        layout.heartbeats_dir,
        layout.status_dir,
        layout.job_exit_dir,
        layout.finished_file,
        layout.cancel_file,
        layout.attempt_ended_file,
        layout.resume_request_file,
        layout.launcher_file,
        layout.ray_cluster_file,
        layout.interrupted_file,
        layout.recovery_file,
        layout.tasks_dir,
        layout.procs_dir,
        watch / "requests",
        watch / "evidence",
        watch / "claims",
    ]


def prepare_run_dir(plan: LaunchPlan, lock: bool = False) -> int | None:
    """Create the run directory safely (``rundir.secure``), take its lock (``lock``: for as long
    as the returned descriptor stays open), remove the previous launch's live state (a symlink
    is removed, never followed) and write the plan's files."""
    run_dir = Path(plan.run_dir)
    ensure_run_dir(run_dir, run_dir.parents[1], plan.dir_mode)
    held = hold_run_lock(run_dir / "watchdog") if lock else None
    for path in map(Path, plan.reset_paths):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists() or path.is_symlink():
            path.unlink()
    layout = RunLayout(Path(plan.run_dir))
    for directory in [*layout.live_dirs(), *map(Path, plan.dirs)]:
        directory.mkdir(parents=True, exist_ok=True)
    for path, content in plan.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(path), content)
    return held
