"""The validated configuration as plain data; every default is declared here, once.

AReaL's own keys (``experiment_name``, ``trial_name``, ``cluster.*``) keep their meaning; every
other top-level key is passed through untouched to the training script. Our sections are
``launch`` and ``watchdog`` (docs/configuration.md).
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_watchdog.config.reading.keys import Choice, key

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


class HangAction(Choice):
    """What the watchdog does about a hang (``watchdog.on_hang``, report.json's ``action``, the
    sidecar's ``rundir.sidecar_files.hang_request``). Defined with the config that names it; the
    records below it in the layers (rundir) take it from here."""

    REPORT = "report"  # post the report; the job runs on
    CANCEL = "cancel"  # post it and end the job
    RESUME = "resume"  # post it and end the job; the launcher replays the step, starts it again

    @property
    def ends_job(self) -> bool:
        return self is not HangAction.REPORT


class StackMethod(Choice):
    """How stacks are taken: py-spy, the ranks' own faulthandler dump, or py-spy first."""

    AUTO = "auto"
    PY_SPY = "py-spy"
    FAULTHANDLER = "faulthandler"


class GpuBackend(Choice):
    """Where GPU samples come from."""

    AUTO = "auto"
    NVML = "nvml"
    NVIDIA_SMI = "nvidia-smi"
    RECORDED = "recorded"
    NONE = "none"


class ResumeAllocation(Choice):
    """Where a resume runs on Slurm: a new job, or the allocation the job kept."""

    NEW = "new"
    SAME = "same"


class LaunchMode(Choice):
    """How the script runs (``config.areal_side.areal.resolve_mode`` decides ``auto``)."""

    AUTO = "auto"
    TORCHRUN = "torchrun"
    SINGLE_CONTROLLER = "single_controller"
    SPMD = "spmd"


ON_HANG_ACTIONS: tuple[str, ...] = tuple(a.value for a in HangAction)


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
    mode: LaunchMode = LaunchMode.AUTO
    args: list[str] = field(default_factory=list)
    nproc_per_node: int = 1
    config_arg: str | None = "--config"
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    slurm: dict[str, Any] = field(default_factory=dict)
    ray: RaySection = field(default_factory=RaySection)
    run_dir_mode: int = 0o700  # the run directory's permissions: nobody else may write there

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", LaunchMode(self.mode))


@dataclass(frozen=True)
class GpuSection:
    """``watchdog.gpu``: the GPU monitor and the idle-GPU stall signal."""

    backend: GpuBackend = key(GpuBackend.AUTO, "where GPU samples come from")
    recording: str | None = key(None, "the recorded backend's file of samples")
    idle_utilization: float = key(10.0, "percent of use at or under which a GPU is idle",
                                  minimum=0.0)  # fmt: skip
    spin_power_fraction: float = key(0.3, "a GPU under this share of its power limit is "
                                     "spinning, not working", minimum=0.0)  # fmt: skip
    idle_timeout: float = key(120.0, "seconds every GPU idle, with no step, before a look",
                              minimum=0.1)  # fmt: skip

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend", GpuBackend(self.backend))


@dataclass(frozen=True)
class ResumeSection:
    """``watchdog.resume``: how ``on_hang: resume`` relaunches."""

    max_attempts: int = key(3, "resumes of one run, at most", minimum=1)
    backoff: float = key(10.0, "seconds before the first resume, doubled for each next",
                         minimum=0.0)  # fmt: skip
    max_replays: int = key(6, "replays of one hang's step: the whole batch, then bisection",
                           minimum=1)  # fmt: skip
    allocation: ResumeAllocation = key(ResumeAllocation.NEW, "Slurm: resume in a new job or in "
                                       "the allocation the job kept")  # fmt: skip

    def __post_init__(self) -> None:
        object.__setattr__(self, "allocation", ResumeAllocation(self.allocation))


@dataclass(frozen=True)
class TrajectorySection:
    """``watchdog.trajectory``: which steps are dumped for replay."""

    enabled: bool = key(True, "dump every recorded step under --watchdog")
    max_keep: int = key(5, "newest dumped steps kept per DP rank", minimum=0)
    pin_steps: list[int] = key(doc="dumped steps never rotated away", factory=list)
    dump_steps: list[int] | None = key(None, "only these steps are dumped", shown="all")


@dataclass(frozen=True)
class MetricsSection:
    """``watchdog.metrics``: Prometheus metrics from every sidecar (docs/monitoring.md)."""

    http: bool = key(False, "serve /metrics over HTTP from every sidecar")
    host: str = key("127.0.0.1", "the address the endpoint binds (docs/security.md)")
    port: int = key(0, "the endpoint's port; 0: the launcher finds a free one (on a "
                    "scheduler's nodes each sidecar does); written to watchdog/metrics/<node>.json",
                    minimum=0)  # fmt: skip
    file_sd_dir: str | None = key(None, "a directory every job shares where each endpoint's "
                                  "Prometheus file_sd target is written too")  # fmt: skip
    textfile_dir: str | None = key(None, "node_exporter's textfile collector directory: a "
                                   ".prom file replaced each poll, removed when the job "
                                   "ends")  # fmt: skip


@dataclass(frozen=True)
class WatchdogSection:
    """How the sidecar decides that the job stalled and what it does then."""

    enabled: bool = key(False, "start the sidecar (same as --watchdog)")
    stall_timeout: float | None = key(None, "seconds without a step before a look; auto: "
                                      "learned from the step intervals", minimum=1e-9,
                                      shown="auto", auto=True)  # fmt: skip
    startup_timeout: float = key(1800.0, "the same before the first step", minimum=1e-9)
    teardown_timeout: float = key(300.0, "the least silence after the job's last step that is "
                                  "a hang", minimum=0.0)  # fmt: skip
    auto_factor: float = key(3.0, "auto: this many times the 99th percentile of the step "
                             "intervals", minimum=1.0)  # fmt: skip
    auto_min_timeout: float = key(5.0, "auto: never below this once learned", minimum=0.0)
    poll_interval: float = key(1.0, "seconds between two looks at logs and processes",
                               minimum=0.05)  # fmt: skip
    step_regex: str = key(DEFAULT_STEP_REGEX, "a step line; group 'step' is its number",
                          shown="see below")  # fmt: skip
    log_files: list[str] = key(doc="more log files to follow (globs)", factory=list)
    on_hang: HangAction = key(HangAction.REPORT, "report, cancel or resume")
    resume: ResumeSection = field(default_factory=ResumeSection)
    stack_method: StackMethod = key(StackMethod.AUTO, "how stacks are taken")
    dump_timeout: float = key(5.0, "seconds per stack dump, at most", minimum=0.1)
    crash_grace: float = key(10.0, "seconds a dead rank may go unreported while its peers live",
                             minimum=0.0)  # fmt: skip
    debug_env: dict[str, str] = key(doc="variables exported to the ranks (null removes one)",
                                    factory=dict, shown="see below")  # fmt: skip
    notify: list[dict[str, Any]] = key(doc="notification sinks (SinkSpec dicts: no secrets)",
                                       factory=list, kind="list of sinks")  # fmt: skip
    spool_retry_interval: float = key(30.0, "seconds between retries of undelivered messages",
                                      minimum=0.1)  # fmt: skip
    flight_recorder: bool = key(True, "take every rank's Flight Recorder trace on a stall")
    gpu: GpuSection = field(default_factory=GpuSection)
    confirm_after: float | None = key(None, "seconds between the two looks before on_hang "
                                      "runs; auto: half the threshold (in the warm-up, of what "
                                      "the steps so far give), 2 to 10 s", minimum=0.0,
                                      shown="auto", auto=True)  # fmt: skip
    cancel_after: float | None = key(None, "the hard limit: no step for this long runs "
                                     "on_hang, unless data still moves; auto: 5x the "
                                     "threshold", minimum=1e-9,
                                     shown="auto", auto=True)  # fmt: skip
    node_timeout: float = key(10.0, "seconds a node's status may stand still before it is lost",
                              minimum=0.5)  # fmt: skip
    evidence_timeout: float = key(10.0, "seconds the leader waits for the nodes' evidence",
                                  minimum=0.1)  # fmt: skip
    trajectory: TrajectorySection = field(default_factory=TrajectorySection)
    metrics: MetricsSection = field(default_factory=MetricsSection)

    def __post_init__(self) -> None:
        # read back from launch.json: the choices are their plain values, sections dicts
        object.__setattr__(self, "on_hang", HangAction(self.on_hang))
        object.__setattr__(self, "stack_method", StackMethod(self.stack_method))
        sections = (("gpu", GpuSection), ("resume", ResumeSection),
                    ("trajectory", TrajectorySection), ("metrics", MetricsSection))  # fmt: skip
        for name, section in sections:
            value = getattr(self, name)
            if isinstance(value, dict):
                object.__setattr__(self, name, section(**value))


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
                "max_keep": self.watchdog.trajectory.max_keep,
                "path": str(self.trajectory_dir),
            }
        return tree
