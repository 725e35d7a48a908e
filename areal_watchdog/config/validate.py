"""Check a resolved config tree and turn it into a JobConfig: AReaL's names and cluster, our
``launch`` and ``watchdog`` sections. Unknown keys in our sections are typos and are refused."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path
from typing import Any

import regex

from areal_watchdog.config.debug_env import DEFAULT_DEBUG_ENV
from areal_watchdog.config.model import (
    DEFAULT_EXPERIMENT,
    DEFAULT_FILEROOT,
    DEFAULT_TRIAL,
    MAX_NPROC_PER_NODE,
    SLURM_KEYS,
    GpuBackend,
    JobConfig,
    LaunchMode,
    LaunchSection,
    RaySection,
    WatchdogSection,
)
from areal_watchdog.config.reading.checks import Checker, default
from areal_watchdog.config.reading.read import read_section
from areal_watchdog.config.sinks import parse_sinks

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
LAUNCH_KEYS = {
    "entrypoint", "mode", "args", "nproc_per_node", "config_arg", "python", "env", "slurm",
    "ray", "run_dir_mode",
}  # fmt: skip
RAY_KEYS = {"address", "nodes", "cpus_per_node", "gpus_per_node"}


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
        mode=check.choice(
            tree, "launch.mode", tuple(m.value for m in LaunchMode), default(LaunchSection, "mode")
        ),
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
    """Every key read as its field declares it (``config/reading/keys.py``); a few need more."""
    special = {
        "watchdog.step_regex": _step_regex,
        "watchdog.debug_env": _debug_env,
        "watchdog.notify": _notify,
    }
    section = read_section(check, wd, "watchdog", WatchdogSection, special)
    if section.gpu.backend is GpuBackend.RECORDED and not section.gpu.recording:
        raise check.fail(
            "watchdog.gpu.recording", "is missing: the recorded backend replays a file of samples"
        )
    _metrics(check, section)
    return section


def _metrics(check: Checker, section: WatchdogSection) -> None:
    """Metrics need their client library, and a textfile directory that exists."""
    metrics = section.metrics
    if not metrics.http and not metrics.textfile_dir:
        return
    key = "watchdog.metrics.http" if metrics.http else "watchdog.metrics.textfile_dir"
    if importlib.util.find_spec("prometheus_client") is None:
        raise check.fail(key, "needs prometheus_client: pip install 'areal-watchdog[metrics]'")
    if metrics.file_sd_dir and not Path(metrics.file_sd_dir).is_dir():
        raise check.fail("watchdog.metrics.file_sd_dir", f"{metrics.file_sd_dir} is not a "
                         "directory; name the one Prometheus' file_sd_configs reads")  # fmt: skip
    if metrics.textfile_dir and not Path(metrics.textfile_dir).is_dir():
        raise check.fail("watchdog.metrics.textfile_dir", f"{metrics.textfile_dir} is not a "
                         "directory; name node_exporter's textfile directory")  # fmt: skip


def _notify(check: Checker, wd: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """The shape every sink shares; each sink's own keys are its registry's to check."""
    return [s.to_dict() for s in parse_sinks(check.mapping_list(wd, key), check.source)]


def _step_regex(check: Checker, wd: dict[str, Any], key: str) -> str:
    pattern = check.text(wd, key, default(WatchdogSection, "step_regex"))
    try:
        compiled = regex.compile(pattern)  # the engine the sidecar matches with
    except (regex.error, TypeError) as exc:
        raise check.fail(key, f"is not a valid regular expression: {exc}") from None
    if compiled.groups < 1:
        raise check.fail(key, "needs a group that captures the step number")
    return pattern


def _debug_env(check: Checker, wd: dict[str, Any], key: str) -> dict[str, str]:
    """AReaL's debug variables, with the config's additions; null or false removes one."""
    env = dict(DEFAULT_DEBUG_ENV)
    for name, value in check.section(wd, key).items():
        if value is None or value is False:
            env.pop(str(name), None)
        else:
            env[str(name)] = str(value)
    return env
