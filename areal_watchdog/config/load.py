"""Load an AReaL-style OmegaConf YAML file, apply Hydra-style overrides, validate our sections.

AReaL's own keys (``experiment_name``, ``trial_name``, ``cluster.*``) keep their meaning; every
other top-level key is passed through untouched to the training script. Our sections are
``launch`` and ``watchdog`` (documented in ``docs/configuration.md``).
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from areal_watchdog.common.errors import ConfigError, UserError
from areal_watchdog.config.debug_env import DEFAULT_DEBUG_ENV
from areal_watchdog.notify.sinks import parse_sinks

# AReaL's step line is ``... Epoch 1/1 Step 3/233 Train step 3/233 done.``: the last match on a
# line wins, so the global "Train step" beats the epoch-local "Step".
DEFAULT_STEP_REGEX = (
    r"(?i)(?:\btrain step|\bglobal[_ ]step|\bstep|\biteration|\biter)\s*[=:#]?\s*(?P<step>\d+)"
)
OUR_SECTIONS = ("launch", "watchdog")
ON_HANG_ACTIONS = ("report", "cancel")
STACK_METHODS = ("auto", "py-spy", "faulthandler")
GPU_BACKENDS = ("auto", "nvml", "nvidia-smi", "recorded", "none")


@dataclass(frozen=True)
class LaunchSection:
    """How to start the training script."""

    entrypoint: str
    args: list[str] = field(default_factory=list)
    nproc_per_node: int = 1
    config_arg: str | None = "--config"
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    slurm: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WatchdogSection:
    """How the sidecar decides that the job stalled and what it does then."""

    enabled: bool = False
    stall_timeout: float | None = 600.0  # None means "auto"
    startup_timeout: float = 1800.0
    poll_interval: float = 1.0
    step_regex: str = DEFAULT_STEP_REGEX
    log_files: list[str] = field(default_factory=list)
    on_hang: str = "report"
    auto_factor: float = 5.0
    auto_min_timeout: float = 60.0
    dump_timeout: float = 5.0
    stack_method: str = "auto"
    crash_grace: float = 10.0
    flight_recorder: bool = True
    gpu_backend: str = "auto"
    gpu_recording: str | None = None
    gpu_idle_utilization: float = 10.0
    gpu_spin_power_fraction: float = 0.3
    gpu_idle_timeout: float = 120.0
    node_timeout: float = 10.0
    evidence_timeout: float = 10.0
    debug_env: dict[str, str] = field(default_factory=dict)
    notify: list[dict[str, Any]] = field(default_factory=list)  # SinkSpec dicts: no secrets
    spool_retry_interval: float = 30.0
    trajectory_dump: bool = True
    trajectory_max_keep: int = 5
    trajectory_pin_steps: list[int] = field(default_factory=list)
    trajectory_dump_steps: list[int] | None = None


@dataclass(frozen=True)
class JobConfig:
    """A validated configuration: AReaL keys, our two sections and the resolved raw tree."""

    source: str
    experiment_name: str
    trial_name: str
    fileroot: str
    n_nodes: int
    n_gpus_per_node: int
    launch: LaunchSection
    watchdog: WatchdogSection
    raw: dict[str, Any]

    @property
    def run_dir(self) -> Path:
        """``<fileroot>/<experiment_name>/<trial_name>``, where AReaL keeps a trial's files."""
        return Path(self.fileroot) / self.experiment_name / self.trial_name

    @property
    def trajectory_dir(self) -> Path:
        """Where step batches are dumped: ``trajectory_debug.path`` or AReaL's default."""
        section = self.raw.get("trajectory_debug")
        if isinstance(section, dict) and section.get("path"):
            return Path(str(section["path"]))
        return self.run_dir / "debug_trajectories"

    def job_tree(self, dumping: bool = False) -> dict[str, Any]:
        """The resolved config the training script receives: everything but our sections.

        With ``dumping``, an AReaL ``trajectory_debug`` section is switched to dumping (unless
        the config replays a dump already) with our ``max_keep`` and path.
        """
        tree = {k: v for k, v in self.raw.items() if k not in OUR_SECTIONS}
        section = tree.get("trajectory_debug")
        if dumping and isinstance(section, dict) and not section.get("replay_rollout_data"):
            tree["trajectory_debug"] = {
                **section,
                "dump_rollout_data": True,
                "max_keep": self.watchdog.trajectory_max_keep,
                "path": str(self.trajectory_dir),
            }
        return tree


def load_config(
    path: str | os.PathLike[str], overrides: list[str] | tuple[str, ...] = ()
) -> JobConfig:
    """Read, override, resolve and validate a config file; raise ConfigError on any problem."""
    source = str(path)
    tree = _read_yaml(source)
    for item in overrides:
        _apply_override(tree, item, source)
    try:
        raw = OmegaConf.to_container(tree, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        raise ConfigError(source, str(key), f"cannot resolve the value: {exc.msg}") from None
    if not isinstance(raw, dict):
        raise ConfigError(source, "<root>", "the file must hold a mapping of keys")
    return _validate(source, raw)


def _read_yaml(source: str) -> Any:
    if not os.path.isfile(source):
        raise UserError(f"{source}: no such config file.")
    try:
        with open(source, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, "<yaml>", f"YAML syntax error at {where}: {problem}.") from None
    if not isinstance(data, dict):
        raise ConfigError(source, "<root>", "the file must hold a mapping of keys")
    return OmegaConf.create(data)


def _apply_override(tree: Any, item: str, source: str) -> None:
    """Apply one Hydra-style override: ``a.b=v``, ``+a.b=v`` (add), ``++a.b=v``, ``~a.b``."""
    where = f"override '{item}'"
    if item.startswith("~"):
        key = item[1:].split("=", 1)[0]
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(tree, parent) if parent else tree
        if node is None or leaf not in node:
            raise ConfigError(where, key, f"cannot delete: the key is not in {source}")
        del node[leaf]
        return
    if "=" not in item:
        raise ConfigError(where, item, "overrides take the form key=value, +key=value or ~key")
    key, _, text = item.partition("=")
    mode = "set"
    if key.startswith("++"):
        key, mode = key[2:], "force"
    elif key.startswith("+"):
        key, mode = key[1:], "add"
    if not re.fullmatch(r"[A-Za-z_][\w-]*(\.[\w-]+)*", key):
        raise ConfigError(where, key, "is not a dotted key name")
    exists = OmegaConf.select(tree, key, default="\0missing") != "\0missing"
    if mode == "set" and not exists:
        raise ConfigError(
            where, key, f"is not in {source}; use +{key}={text} to add a new key (Hydra grammar)"
        )
    if mode == "add" and exists:
        raise ConfigError(where, key, f"is already in {source}; use {key}={text} to change it")
    try:
        value = yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        value = text
    OmegaConf.update(tree, key, value, merge=True, force_add=True)


def _validate(source: str, raw: dict[str, Any]) -> JobConfig:
    check = _Checker(source)
    experiment = check.text(raw, "experiment_name", default="areal-job")
    trial = check.text(raw, "trial_name", default="trial0")
    if "_" in experiment or "/" in experiment:
        raise ConfigError(source, "experiment_name", "may not contain '_' or '/' (AReaL's rule)")
    if "-" in trial or "/" in trial:
        raise ConfigError(source, "trial_name", "may not contain '-' or '/' (AReaL's rule)")
    cluster = check.section(raw, "cluster")
    fileroot = check.text(cluster, "cluster.fileroot", default="/tmp/areal/experiments")
    n_nodes = check.integer(cluster, "cluster.n_nodes", default=1, minimum=1)
    n_gpus = check.integer(cluster, "cluster.n_gpus_per_node", default=0, minimum=0)

    launch_raw = check.section(raw, "launch")
    entrypoint = launch_raw.get("entrypoint")
    if not entrypoint or not isinstance(entrypoint, str):
        raise ConfigError(
            source,
            "launch.entrypoint",
            "is missing: name the training script (a .py file or a module)",
        )
    launch = LaunchSection(
        entrypoint=entrypoint,
        args=check.string_list(launch_raw, "launch.args"),
        nproc_per_node=check.integer(
            launch_raw, "launch.nproc_per_node", default=max(n_gpus, 1), minimum=1
        ),
        config_arg=check.optional_text(launch_raw, "launch.config_arg", default="--config"),
        python=check.text(launch_raw, "launch.python", default=sys.executable),
        env=check.string_map(launch_raw, "launch.env"),
        slurm=check.section(launch_raw, "launch.slurm"),
    )

    wd = check.section(raw, "watchdog")
    stall = wd.get("stall_timeout", WatchdogSection.stall_timeout)
    if stall == "auto":
        stall_timeout = None
    else:
        stall_timeout = check.number(
            wd, "watchdog.stall_timeout", default=600.0, minimum=1e-9, auto=True
        )
    step_regex = check.text(wd, "watchdog.step_regex", default=DEFAULT_STEP_REGEX)
    try:
        compiled = re.compile(step_regex)
    except re.error as exc:
        raise ConfigError(
            source, "watchdog.step_regex", f"is not a valid regular expression: {exc}"
        ) from None
    if compiled.groups < 1:
        raise ConfigError(
            source, "watchdog.step_regex", "needs a group that captures the step number"
        )
    gpu = check.section(wd, "watchdog.gpu")
    trajectory = check.section(wd, "watchdog.trajectory")
    dump_steps = trajectory.get("dump_steps")
    debug_env = dict(DEFAULT_DEBUG_ENV)
    for name, value in check.section(wd, "watchdog.debug_env").items():
        if value is None or value is False:
            debug_env.pop(str(name), None)
        else:
            debug_env[str(name)] = str(value)
    if gpu.get("backend") == "recorded" and not gpu.get("recording"):
        raise ConfigError(
            source,
            "watchdog.gpu.recording",
            "is missing: the recorded backend replays a file of samples",
        )
    watchdog = WatchdogSection(
        enabled=check.boolean(wd, "watchdog.enabled", default=False),
        stall_timeout=stall_timeout,
        startup_timeout=check.number(wd, "watchdog.startup_timeout", default=1800.0, minimum=1e-9),
        poll_interval=check.number(wd, "watchdog.poll_interval", default=1.0, minimum=0.05),
        step_regex=step_regex,
        log_files=check.string_list(wd, "watchdog.log_files"),
        on_hang=check.choice(wd, "watchdog.on_hang", ON_HANG_ACTIONS, default="report"),
        auto_factor=check.number(wd, "watchdog.auto_factor", default=5.0, minimum=1.0),
        auto_min_timeout=check.number(wd, "watchdog.auto_min_timeout", default=60.0, minimum=0.0),
        dump_timeout=check.number(wd, "watchdog.dump_timeout", default=5.0, minimum=0.1),
        stack_method=check.choice(wd, "watchdog.stack_method", STACK_METHODS, default="auto"),
        crash_grace=check.number(wd, "watchdog.crash_grace", default=10.0, minimum=0.0),
        flight_recorder=check.boolean(wd, "watchdog.flight_recorder", default=True),
        gpu_backend=check.choice(gpu, "watchdog.gpu.backend", GPU_BACKENDS, default="auto"),
        gpu_recording=check.optional_text(gpu, "watchdog.gpu.recording", default=None),
        gpu_idle_utilization=check.number(
            gpu, "watchdog.gpu.idle_utilization", default=10.0, minimum=0.0
        ),
        gpu_spin_power_fraction=check.number(
            gpu, "watchdog.gpu.spin_power_fraction", default=0.3, minimum=0.0
        ),
        gpu_idle_timeout=check.number(gpu, "watchdog.gpu.idle_timeout", default=120.0, minimum=0.1),
        node_timeout=check.number(wd, "watchdog.node_timeout", default=10.0, minimum=0.5),
        evidence_timeout=check.number(wd, "watchdog.evidence_timeout", default=10.0, minimum=0.1),
        debug_env=debug_env,
        notify=[
            s.to_dict() for s in parse_sinks(check.mapping_list(wd, "watchdog.notify"), source)
        ],
        spool_retry_interval=check.number(
            wd, "watchdog.spool_retry_interval", default=30.0, minimum=0.1
        ),
        trajectory_dump=check.boolean(trajectory, "watchdog.trajectory.enabled", default=True),
        trajectory_max_keep=check.integer(
            trajectory, "watchdog.trajectory.max_keep", default=5, minimum=0
        ),
        trajectory_pin_steps=check.int_list(trajectory, "watchdog.trajectory.pin_steps"),
        trajectory_dump_steps=None
        if dump_steps is None
        else check.int_list(trajectory, "watchdog.trajectory.dump_steps"),
    )
    return JobConfig(
        source=source,
        experiment_name=experiment,
        trial_name=trial,
        fileroot=fileroot,
        n_nodes=n_nodes,
        n_gpus_per_node=n_gpus,
        launch=launch,
        watchdog=watchdog,
        raw=raw,
    )


class _Checker:
    """Typed reads of config values that raise ConfigError naming the file and the key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def _fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(self.source, key, message)

    @staticmethod
    def _leaf(key: str) -> str:
        return key.rsplit(".", 1)[-1]

    def section(self, tree: dict[str, Any], key: str) -> dict[str, Any]:
        value = tree.get(self._leaf(key))
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self._fail(key, f"must be a mapping, got {type(value).__name__} {value!r}")
        return value

    def text(self, tree: dict[str, Any], key: str, default: str) -> str:
        value = tree.get(self._leaf(key), default)
        if value is None:
            return default
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise self._fail(key, f"must be a string, got {value!r}")
        return str(value)

    def optional_text(self, tree: dict[str, Any], key: str, default: str | None) -> str | None:
        if self._leaf(key) in tree and tree[self._leaf(key)] is None:
            return None
        return self.text(tree, key, default or "")

    def boolean(self, tree: dict[str, Any], key: str, default: bool) -> bool:
        value = tree.get(self._leaf(key), default)
        if not isinstance(value, bool):
            raise self._fail(key, f"must be true or false, got {value!r}")
        return value

    def integer(self, tree: dict[str, Any], key: str, default: int, minimum: int) -> int:
        value = tree.get(self._leaf(key), default)
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, str) and value.strip().isdigit():
                value = int(value)
            else:
                raise self._fail(key, f"must be a whole number, got {value!r}")
        if value < minimum:
            raise self._fail(key, f"must be at least {minimum}, got {value}")
        return value

    def number(
        self, tree: dict[str, Any], key: str, default: float, minimum: float, auto: bool = False
    ) -> float:
        value = tree.get(self._leaf(key), default)
        hint = " or 'auto'" if auto else ""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._fail(key, f"must be a number of seconds{hint}, got {value!r}")
        if math.isnan(value) or value < minimum:
            raise self._fail(key, f"must be positive{hint}, got {value}")
        return float(value)

    def choice(self, tree: dict[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
        value = tree.get(self._leaf(key), default)
        if value not in choices:
            raise self._fail(key, f"must be one of {', '.join(choices)}; got {value!r}")
        return value

    def string_list(self, tree: dict[str, Any], key: str) -> list[str]:
        value = tree.get(self._leaf(key)) or []
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or any(isinstance(v, (dict, list)) for v in value):
            raise self._fail(key, f"must be a list of strings, got {value!r}")
        return [str(v) for v in value]

    def string_map(self, tree: dict[str, Any], key: str) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.section(tree, key).items() if v is not None}

    def int_list(self, tree: dict[str, Any], key: str) -> list[int]:
        value = tree.get(self._leaf(key)) or []
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise self._fail(key, f"must be a list of step numbers, got {value!r}")
        return value

    def mapping_list(self, tree: dict[str, Any], key: str) -> list[dict[str, Any]]:
        value = tree.get(self._leaf(key)) or []
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise self._fail(key, "must be a list of mappings")
        return value
