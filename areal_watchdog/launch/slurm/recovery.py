"""What a resume may ask of Slurm (``launch.recovery``): a replay on a one-node allocation (or
a node of the kept one) without the nodes the hangs named, and a new allocation that excludes
them, unless the job keeps its allocation (``resume.allocation: same``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from areal_watchdog.common.errors import UserError
from areal_watchdog.config.model import JobConfig
from areal_watchdog.launch.recovery import Recovery
from areal_watchdog.launch.slurm.control.jobs import cluster_nodes
from areal_watchdog.launch.slurm.replay import NEW_ALLOCATION, SlurmReplayHost

_WHERE_RESUMED = {  # where a resume runs on Slurm, by launch mode (or resume.allocation)
    "torchrun": "in a new allocation (--exclude) without the nodes a transient hang named",
    "spmd": "in a new allocation (--exclude) without the nodes a transient hang named",
    "single_controller": "AReaL's jobs submitted again (their scheduling_spec's exclude) "
    "without the nodes a transient hang named",
    "same": "as a new step of the same allocation (watchdog.resume.allocation: same), on its "
    "nodes: a node a hang named is not left out",
}


class _Submitted(Protocol):
    wait: bool  # the launcher follows the job (--wait)
    allocation: str | None  # the job kept after a hang (allocation: same)


class SlurmRecovery(Recovery):
    """Slurm's answers, reading the backend's state as it is at each question."""

    def __init__(self, backend: _Submitted) -> None:
        self.backend = backend

    def refusal(self, config: JobConfig, mode: str) -> str | None:
        if mode == "single_controller" and config.watchdog.resume.allocation == "same":
            return (
                "watchdog.resume.allocation: same keeps a Slurm job's allocation, but AReaL's "
                "single controller submits its own jobs: use allocation: new"
            )
        if mode != "single_controller" and not self.backend.wait:
            return "watchdog.on_hang: resume on Slurm follows the job from this shell: add --wait"
        return None

    def replay_host(self, config: JobConfig, avoid: set[str]) -> SlurmReplayHost:
        return SlurmReplayHost(config, avoid, self.backend.allocation)

    def known_nodes(self, named: set[str]) -> set[str]:
        if not named:
            return set()
        try:
            return named & cluster_nodes()  # sbatch refuses any other name
        except UserError:  # no sinfo here: leave no node out rather than fail the resume
            return set()

    def leaves_out_nodes(self) -> bool:
        return self.backend.allocation is None

    def without_nodes(self, config: JobConfig, nodes: set[str]) -> JobConfig:
        if not nodes:
            return config
        slurm = dict(config.launch.slurm)
        given = {n for n in str(slurm.get("exclude") or "").split(",") if n}
        slurm["exclude"] = ",".join(sorted(given | nodes))
        return replace(config, launch=replace(config.launch, slurm=slurm))

    def allocation(self) -> str:
        kept = self.backend.allocation
        return f"same (job {kept})" if kept else "new"

    def dry_run(self, config: JobConfig, mode: str) -> tuple[str, list[str]]:
        same = config.watchdog.resume.allocation == "same"
        where = f"{NEW_ALLOCATION} the hangs did not name"
        if same:
            where = f"on a node of the job's allocation the hangs did not name (else {where})"
        return where, [f"  {_WHERE_RESUMED['same' if same else mode]}"]
