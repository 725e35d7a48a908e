"""What the launcher tells every sidecar, through ``<run_dir>/watchdog/launch.json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import read_json
from areal_watchdog.common.errors import UserError
from areal_watchdog.config.model import JobConfig, WatchdogSection
from areal_watchdog.rundir.layout import RunLayout


@dataclass(frozen=True)
class LaunchInfo:
    """The job as launched: identity, shape and the watchdog's settings."""

    run_id: str
    backend: str
    run_dir: str
    world_size: int
    nodes: list[str]
    nproc_per_node: int
    experiment_name: str
    trial_name: str
    fileroot: str
    watchdog: WatchdogSection
    trajectory_dir: str | None = None
    job_id: str | None = None  # the scheduler's name for the job (Slurm's id, Ray's submission)
    job_address: str | None = None  # where that scheduler answers for it (Ray: the Jobs API)
    mode: str = "torchrun"  # torchrun | single_controller | spmd (config.model.LaunchMode)
    rank_role: str | None = None  # single controller: the AReaL role whose workers are ranks
    # AReaL's single controller on Slurm: ``nodes`` is the controller's host, the leader; the
    # nodes AReaL's jobs land on join when their sidecars first publish.
    dynamic_nodes: bool = False
    # AReaL's ``total_train_steps``: its step lines say the epochs' total even when this caps it
    total_steps: int | None = None
    # where a scheduler runs the job: the backend's command a sidecar runs to place itself and
    # to end the job when no launcher can (``watch.cluster.scheduler``); None: the launcher ends it
    scheduler_command: list[str] | None = None
    # a backend that carries the ranks' output elsewhere names where (Ray: its driver's log)
    step_logs: list[str] | None = None

    @classmethod
    def for_config(
        cls,
        config: JobConfig,
        run_id: str,
        backend: str,
        run_dir: Path,
        world_size: int,
        nodes: list[str],
        mode: str = "torchrun",
        rank_role: str | None = None,
    ) -> LaunchInfo:
        """What a launch of ``config`` tells its sidecars."""
        return cls(
            mode=mode,
            rank_role=rank_role,
            run_id=run_id,
            backend=backend,
            run_dir=str(run_dir),
            world_size=world_size,
            nodes=nodes,
            nproc_per_node=config.launch.nproc_per_node,
            experiment_name=config.experiment_name,
            trial_name=config.trial_name,
            fileroot=config.fileroot,
            watchdog=config.watchdog,
            trajectory_dir=str(config.trajectory_dir)
            if config.watchdog.trajectory.enabled
            else None,
            total_steps=_total_steps(config.raw.get("total_train_steps")),
        )

    @property
    def layout(self) -> RunLayout:
        return RunLayout(Path(self.run_dir))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchInfo:
        fields = dict(data)
        fields["watchdog"] = WatchdogSection(**fields["watchdog"])
        return cls(**fields)

    @classmethod
    def load(cls, run_dir: Path) -> LaunchInfo:
        data = read_json(RunLayout(run_dir).launch_file)
        if not isinstance(data, dict):
            raise UserError(
                f"{run_dir}: no readable watchdog/launch.json; is this a run directory "
                "made by areal-launch?"
            )
        return cls.from_dict(data)


def _total_steps(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
