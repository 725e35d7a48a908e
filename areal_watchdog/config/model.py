"""The validated configuration as plain data; every default is declared here, once.

AReaL's own keys (``experiment_name``, ``trial_name``, ``cluster.*``) keep their meaning; every
other top-level key is passed through untouched to the training script. Our sections are
``launch`` and ``watchdog`` (docs/configuration.md).
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

# AReaL's step line is ``... Epoch 1/1 Step 3/233 Train step 3/233 done.``: the last match on a
# line wins, so the global "Train step" beats the epoch-local "Step"; ``total`` (optional) says
# when the step seen is the job's last one (what follows it is teardown).
DEFAULT_STEP_REGEX = (
    r"(?i)(?:\btrain step|\bglobal[_ ]step|\bstep|\biteration|\biter)\s*[=:#]?\s*(?P<step>\d+)"
    r"(?:/(?P<total>\d+))?"
)
OUR_SECTIONS = ("launch", "watchdog")
DEFAULT_EXPERIMENT = "areal-job"
DEFAULT_TRIAL = "trial0"
DEFAULT_FILEROOT = "/tmp/areal/experiments"
MAX_NPROC_PER_NODE = 1024
SLURM_KEYS = {
    "partition": str,
    "account": str,
    "qos": str,
    "time": (int, str),
    "constraint": str,
    "exclusive": bool,
    "nodelist": str,
    "exclude": str,
    "cpus_per_task": int,
    "mem": str,
    "additional_parameters": dict,
    "srun_args": list,
    "container_prefix": (list, str),
    "job_name": str,
    "template_dir": str,
}


class HangAction(str, Enum):
    """What the watchdog does about a hang (``watchdog.on_hang``, report.json's ``action``, the
    sidecar's ``rundir.hang_request``). Defined with the config that names it; the records
    below it in the layers (rundir) take it from here."""

    REPORT = "report"  # post the report; the job runs on
    CANCEL = "cancel"  # post it and end the job
    RESUME = "resume"  # post it and end the job; the launcher replays the step, starts it again

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def ends_job(self) -> bool:
        return self is not HangAction.REPORT


ON_HANG_ACTIONS: tuple[str, ...] = tuple(a.value for a in HangAction)
STACK_METHODS = ("auto", "py-spy", "faulthandler")
GPU_BACKENDS = ("auto", "nvml", "nvidia-smi", "recorded", "none")


@dataclass(frozen=True)
class RaySection:
    """Where a ``ray`` launch runs: an existing cluster's Jobs API (``address``, else
    ``RAY_ADDRESS``), or a cluster of ``nodes`` raylets this machine starts for the run."""

    address: str | None = None  # http://HEAD:8265, the dashboard that serves Ray's Jobs API
    nodes: int | None = None  # this machine's own cluster: raylets (None: cluster.n_nodes)
    cpus_per_node: int = 4  # logical CPUs each of its raylets offers
    gpus_per_node: int = 0  # logical GPUs each offers (default: cluster.n_gpus_per_node)


@dataclass(frozen=True)
class LaunchSection:
    """How to start the training script."""

    entrypoint: str
    mode: str = "auto"  # auto | torchrun | single_controller | spmd (config.areal)
    args: list[str] = field(default_factory=list)
    nproc_per_node: int = 1
    config_arg: str | None = "--config"
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    slurm: dict[str, Any] = field(default_factory=dict)
    ray: RaySection = field(default_factory=RaySection)
    run_dir_mode: int = 0o700  # the run directory's permissions: nobody else may write there


@dataclass(frozen=True)
class WatchdogSection:
    """How the sidecar decides that the job stalled and what it does then."""

    enabled: bool = False
    stall_timeout: float | None = None  # None means "auto": learned from the step intervals
    startup_timeout: float = 1800.0
    teardown_timeout: float = 300.0  # the least silence after the job's last step that is a hang
    poll_interval: float = 1.0
    step_regex: str = DEFAULT_STEP_REGEX
    log_files: list[str] = field(default_factory=list)
    on_hang: HangAction = HangAction.REPORT
    auto_factor: float = 3.0  # auto: this many times the 99th percentile of the step intervals
    auto_min_timeout: float = 5.0  # auto: never below this once learned
    dump_timeout: float = 5.0
    stack_method: str = "auto"
    crash_grace: float = 10.0
    flight_recorder: bool = True
    gpu_backend: str = "auto"
    gpu_recording: str | None = None
    gpu_idle_utilization: float = 10.0
    gpu_spin_power_fraction: float = 0.3
    gpu_idle_timeout: float = 120.0
    confirm_after: float | None = None  # the second look before on_hang=cancel (None: auto)
    cancel_after: float | None = None  # no new step for this long ends the job (None: auto)
    resume_max_attempts: int = 3  # on_hang=resume: relaunches of one run, at most
    resume_backoff: float = 10.0  # seconds before the first relaunch, doubled for each next
    resume_max_replays: int = 6  # replays of one hang's step: the whole batch, then bisection
    resume_allocation: str = "new"  # Slurm: resume in a new allocation, or in the same one
    node_timeout: float = 10.0
    evidence_timeout: float = 10.0
    debug_env: dict[str, str] = field(default_factory=dict)
    notify: list[dict[str, Any]] = field(default_factory=list)  # SinkSpec dicts: no secrets
    spool_retry_interval: float = 30.0
    trajectory_dump: bool = True
    trajectory_max_keep: int = 5
    trajectory_pin_steps: list[int] = field(default_factory=list)
    trajectory_dump_steps: list[int] | None = None

    def __post_init__(self) -> None:
        # read back from launch.json, the action is its plain value
        object.__setattr__(self, "on_hang", HangAction(self.on_hang))


# watchdog.<section>.<key> in the YAML is the field <section>_<key>; the one exception:
YAML_SECTIONS = ("gpu", "trajectory", "resume")
YAML_NAMES = {"trajectory_dump": "trajectory.enabled"}


def watchdog_keys() -> dict[str, set[str]]:
    """The keys ``watchdog`` accepts, by section ("" for its own), derived from the fields of
    ``WatchdogSection``: a new key is a new field."""
    keys: dict[str, set[str]] = {"": set(YAML_SECTIONS), **{s: set() for s in YAML_SECTIONS}}
    for name in WatchdogSection.__dataclass_fields__:
        path = YAML_NAMES.get(name, name)
        section, _, key = path.partition(".") if "." in path else path.partition("_")
        if section in YAML_SECTIONS and key:
            keys[section].add(key)
        else:
            keys[""].add(path)
    return keys


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
        tree = copy.deepcopy({k: v for k, v in self.raw.items() if k not in OUR_SECTIONS})
        section = tree.get("trajectory_debug")
        if dumping and isinstance(section, dict) and not section.get("replay_rollout_data"):
            tree["trajectory_debug"] = {
                **section,
                "dump_rollout_data": True,
                "max_keep": self.watchdog.trajectory_max_keep,
                "path": str(self.trajectory_dir),
            }
        return tree
