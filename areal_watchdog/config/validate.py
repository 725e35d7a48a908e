"""Check a resolved config tree and turn it into a JobConfig: AReaL's names and cluster, our
``launch`` and ``watchdog`` sections. Unknown keys in our sections are typos and are refused."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import regex

from areal_watchdog.config.areal import LAUNCH_MODES
from areal_watchdog.config.checks import Checker, default
from areal_watchdog.config.debug_env import DEFAULT_DEBUG_ENV
from areal_watchdog.config.model import (
    DEFAULT_EXPERIMENT,
    DEFAULT_FILEROOT,
    DEFAULT_TRIAL,
    GPU_BACKENDS,
    MAX_NPROC_PER_NODE,
    ON_HANG_ACTIONS,
    SLURM_KEYS,
    STACK_METHODS,
    JobConfig,
    LaunchSection,
    RaySection,
    WatchdogSection,
    watchdog_keys,
)
from areal_watchdog.config.sinks import parse_sinks

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
LAUNCH_KEYS = {
    "entrypoint", "mode", "args", "nproc_per_node", "config_arg", "python", "env", "slurm",
    "ray", "run_dir_mode",
}  # fmt: skip
RAY_KEYS = {"address", "nodes", "cpus_per_node", "gpus_per_node"}
_KEYS = watchdog_keys()
WATCHDOG_KEYS, GPU_KEYS = _KEYS[""], _KEYS["gpu"]
TRAJECTORY_KEYS, RESUME_KEYS = _KEYS["trajectory"], _KEYS["resume"]
# watchdog.<key> (or watchdog.gpu.<key>) -> the smallest value that makes sense
SECONDS = {
    "startup_timeout": 1e-9,
    "teardown_timeout": 0.0,
    "poll_interval": 0.05,
    "auto_factor": 1.0,
    "auto_min_timeout": 0.0,
    "dump_timeout": 0.1,
    "crash_grace": 0.0,
    "node_timeout": 0.5,
    "evidence_timeout": 0.1,
    "spool_retry_interval": 0.1,
}
GPU_NUMBERS = {"idle_utilization": 0.0, "spin_power_fraction": 0.0, "idle_timeout": 0.1}


def validate(source: str, raw: dict[str, Any]) -> JobConfig:
    """The JobConfig of a resolved tree; raises ConfigError naming the first bad key."""
    check = Checker(source)
    experiment, trial = _names(check, raw)
    cluster = check.section(raw, "cluster")
    fileroot = check.text(cluster, "cluster.fileroot", default=DEFAULT_FILEROOT)
    _check_fileroot(check, fileroot)
    n_gpus = check.integer(cluster, "cluster.n_gpus_per_node", default=0, minimum=0)
    return JobConfig(
        source=source,
        experiment_name=experiment,
        trial_name=trial,
        fileroot=fileroot,
        n_nodes=check.integer(cluster, "cluster.n_nodes", default=1, minimum=1),
        n_gpus_per_node=n_gpus,
        launch=_launch(check, check.section(raw, "launch"), n_gpus),
        watchdog=_watchdog(check, check.section(raw, "watchdog")),
        raw=raw,
    )


def _names(check: Checker, raw: dict[str, Any]) -> tuple[str, str]:
    """AReaL's naming rules, and names that keep the run directory inside the fileroot."""
    experiment = check.text(raw, "experiment_name", default=DEFAULT_EXPERIMENT)
    trial = check.text(raw, "trial_name", default=DEFAULT_TRIAL)
    for key, value, banned in (("experiment_name", experiment, "_"), ("trial_name", trial, "-")):
        if not _NAME.fullmatch(value) or value in (".", ".."):
            raise check.fail(
                key, f"{value!r} is not a name: use letters, digits, '.', '-' or '_', no '/'"
            )
        if banned in value:
            raise check.fail(key, f"may not contain {banned!r} (AReaL's rule), got {value!r}")
    return experiment, trial


def _check_fileroot(check: Checker, fileroot: str) -> None:
    """The fileroot, or the nearest folder above it that exists, must be a writable folder."""
    path = Path(fileroot).expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    if not path.is_dir():
        raise check.fail("cluster.fileroot", f"{path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise check.fail("cluster.fileroot", f"{path} is not writable by this user")


def _launch(check: Checker, tree: dict[str, Any], n_gpus: int) -> LaunchSection:
    check.known_keys(tree, "launch", LAUNCH_KEYS)
    entrypoint = tree.get("entrypoint")
    if not entrypoint or not isinstance(entrypoint, str):
        raise check.fail(
            "launch.entrypoint", "is missing: name the training script (a .py file or a module)"
        )
    python = check.text(tree, "launch.python", default=default(LaunchSection, "python"))
    if shutil.which(python) is None:
        raise check.fail("launch.python", f"{python!r} is not an executable Python interpreter")
    slurm = check.section(tree, "launch.slurm")
    check.known_keys(slurm, "launch.slurm", set(SLURM_KEYS))
    nproc = check.integer(
        tree, "launch.nproc_per_node", max(n_gpus, 1), minimum=1, maximum=MAX_NPROC_PER_NODE
    )
    return LaunchSection(
        entrypoint=entrypoint,
        mode=check.choice(tree, "launch.mode", LAUNCH_MODES, default(LaunchSection, "mode")),
        args=check.string_list(tree, "launch.args"),
        nproc_per_node=nproc,
        config_arg=check.optional_text(
            tree, "launch.config_arg", default(LaunchSection, "config_arg")
        ),
        python=python,
        env=check.string_map(tree, "launch.env"),
        slurm=slurm,
        ray=_ray(check, check.section(tree, "launch.ray"), n_gpus),
        run_dir_mode=_run_dir_mode(check, tree),
    )


def _ray(check: Checker, ray: dict[str, Any], n_gpus: int) -> RaySection:
    check.known_keys(ray, "launch.ray", RAY_KEYS)
    address = check.optional_text(ray, "launch.ray.address", None)
    if address is not None and not address.startswith(("http://", "https://")):
        raise check.fail(
            "launch.ray.address", f"must be the Jobs API's URL (http://HEAD:8265), got {address!r}"
        )
    return RaySection(
        address=address,
        nodes=check.integer(ray, "launch.ray.nodes", 1, minimum=1, maximum=16)
        if "nodes" in ray
        else None,
        cpus_per_node=check.integer(ray, "launch.ray.cpus_per_node", 4, minimum=1, maximum=4096),
        gpus_per_node=check.integer(ray, "launch.ray.gpus_per_node", n_gpus, minimum=0,
                                    maximum=MAX_NPROC_PER_NODE),
    )  # fmt: skip


def _run_dir_mode(check: Checker, tree: dict[str, Any]) -> int:
    """Octal permissions (``0700``, ``0o750``): the owner keeps every right, nobody else writes."""
    value = tree.get("run_dir_mode", default(LaunchSection, "run_dir_mode"))
    try:
        mode = value if isinstance(value, int) else int(str(value).removeprefix("0o"), 8)
    except ValueError:
        mode = -1
    if isinstance(value, bool) or not 0 <= mode <= 0o777 or mode & 0o022 or mode & 0o700 != 0o700:
        raise check.fail(
            "launch.run_dir_mode", f"must be like 0700 or 0750 (no write for others), got {value!r}"
        )
    return mode


def _watchdog(check: Checker, wd: dict[str, Any]) -> WatchdogSection:
    check.known_keys(wd, "watchdog", WATCHDOG_KEYS)
    gpu = check.section(wd, "watchdog.gpu")
    check.known_keys(gpu, "watchdog.gpu", GPU_KEYS)
    values: dict[str, Any] = {
        name: check.number(wd, f"watchdog.{name}", default(WatchdogSection, name), minimum)
        for name, minimum in SECONDS.items()
    }
    values.update(
        {
            f"gpu_{name}": check.number(
                gpu, f"watchdog.gpu.{name}", default(WatchdogSection, f"gpu_{name}"), minimum
            )
            for name, minimum in GPU_NUMBERS.items()
        }
    )
    return WatchdogSection(
        enabled=check.boolean(wd, "watchdog.enabled", default(WatchdogSection, "enabled")),
        stall_timeout=_stall_timeout(check, wd),
        confirm_after=_confirm_after(check, wd),
        cancel_after=_cancel_after(check, wd),
        step_regex=_step_regex(check, wd),
        log_files=check.string_list(wd, "watchdog.log_files"),
        on_hang=check.choice(
            wd, "watchdog.on_hang", ON_HANG_ACTIONS, default(WatchdogSection, "on_hang")
        ),
        stack_method=check.choice(
            wd, "watchdog.stack_method", STACK_METHODS, default(WatchdogSection, "stack_method")
        ),
        flight_recorder=check.boolean(
            wd, "watchdog.flight_recorder", default(WatchdogSection, "flight_recorder")
        ),
        gpu_backend=check.choice(
            gpu, "watchdog.gpu.backend", GPU_BACKENDS, default(WatchdogSection, "gpu_backend")
        ),
        gpu_recording=_gpu_recording(check, gpu),
        debug_env=_debug_env(check, wd),
        notify=[
            s.to_dict()
            for s in parse_sinks(check.mapping_list(wd, "watchdog.notify"), check.source)
        ],
        **_trajectory(check, check.section(wd, "watchdog.trajectory")),
        **_resume(check, check.section(wd, "watchdog.resume")),
        **values,
    )


def _stall_timeout(check: Checker, wd: dict[str, Any]) -> float | None:
    """The stall threshold in seconds; absent or 'auto' (None): learned from the job's own step
    intervals (``watch.progress.learned_threshold``)."""
    if wd.get("stall_timeout", "auto") == "auto":
        return None
    return check.number(wd, "watchdog.stall_timeout", 0.0, minimum=1e-9, auto=True)


def _confirm_after(check: Checker, wd: dict[str, Any]) -> float | None:
    """Seconds to the second look before ``on_hang: cancel`` (0: none); absent or 'auto':
    half the stall threshold, between 2 and 10 s."""
    if wd.get("confirm_after", "auto") == "auto":
        return None
    return check.number(wd, "watchdog.confirm_after", 0.0, minimum=0.0, auto=True)


def _cancel_after(check: Checker, wd: dict[str, Any]) -> float | None:
    """The hard limit: no new step for this many seconds runs ``on_hang`` whatever moved;
    absent or 'auto': ``escalation.CANCEL_AFTER_FACTOR`` times the stall threshold or the
    longest step interval seen."""
    if wd.get("cancel_after", "auto") == "auto":
        return None
    return check.number(wd, "watchdog.cancel_after", 0.0, minimum=1e-9, auto=True)


def _step_regex(check: Checker, wd: dict[str, Any]) -> str:
    pattern = check.text(wd, "watchdog.step_regex", default(WatchdogSection, "step_regex"))
    try:
        compiled = regex.compile(pattern)  # the engine the sidecar matches with
    except (regex.error, TypeError) as exc:
        raise check.fail(
            "watchdog.step_regex", f"is not a valid regular expression: {exc}"
        ) from None
    if compiled.groups < 1:
        raise check.fail("watchdog.step_regex", "needs a group that captures the step number")
    return pattern


def _gpu_recording(check: Checker, gpu: dict[str, Any]) -> str | None:
    recording = check.optional_text(gpu, "watchdog.gpu.recording", default=None)
    if gpu.get("backend") == "recorded" and not recording:
        raise check.fail(
            "watchdog.gpu.recording", "is missing: the recorded backend replays a file of samples"
        )
    return recording


def _debug_env(check: Checker, wd: dict[str, Any]) -> dict[str, str]:
    """AReaL's debug variables, with the config's additions; null or false removes one."""
    env = dict(DEFAULT_DEBUG_ENV)
    for name, value in check.section(wd, "watchdog.debug_env").items():
        if value is None or value is False:
            env.pop(str(name), None)
        else:
            env[str(name)] = str(value)
    return env


def _trajectory(check: Checker, tree: dict[str, Any]) -> dict[str, Any]:
    check.known_keys(tree, "watchdog.trajectory", TRAJECTORY_KEYS)
    dump_steps = tree.get("dump_steps")
    return {
        "trajectory_dump": check.boolean(
            tree, "watchdog.trajectory.enabled", default(WatchdogSection, "trajectory_dump")
        ),
        "trajectory_max_keep": check.integer(
            tree, "watchdog.trajectory.max_keep", default(WatchdogSection, "trajectory_max_keep"), 0
        ),
        "trajectory_pin_steps": check.int_list(tree, "watchdog.trajectory.pin_steps"),
        "trajectory_dump_steps": None
        if dump_steps is None
        else check.int_list(tree, "watchdog.trajectory.dump_steps"),
    }


def _resume(check: Checker, tree: dict[str, Any]) -> dict[str, Any]:
    check.known_keys(tree, "watchdog.resume", RESUME_KEYS)
    return {
        "resume_max_attempts": check.integer(
            tree, "watchdog.resume.max_attempts", default(WatchdogSection, "resume_max_attempts"), 1
        ),
        "resume_backoff": check.number(
            tree, "watchdog.resume.backoff", default(WatchdogSection, "resume_backoff"), 0.0
        ),
        "resume_max_replays": check.integer(
            tree, "watchdog.resume.max_replays", default(WatchdogSection, "resume_max_replays"), 1
        ),
        "resume_allocation": check.choice(
            tree, "watchdog.resume.allocation", ("new", "same"), "new"
        ),
    }
