"""The replay that decides a Slurm resume, on a node of an allocation of its own.

``srun`` runs ``areal-launch replay`` (the local backend on that node, watched) in a one-node
allocation with the job's partition, account, time and per-node resources, on a node none of
the run's hangs named: a replay on the node that failed could not tell the data from the node.
Its terminal output is the replay's log.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from areal_watchdog.common.rankset import format_ranks
from areal_watchdog.config.model import JobConfig
from areal_watchdog.launch.slurm.backend import container_prefix
from areal_watchdog.launch.slurm.options import validate_slurm
from areal_watchdog.trajectory.replay_plan import ReplayRequest, plan_replay_config


class SlurmReplayHost:
    """Where a replay runs on Slurm: a one-node allocation without the ``excluded`` nodes."""

    where = "on a node of a one-node Slurm allocation"

    def __init__(self, config: JobConfig, excluded: set[str]) -> None:
        self.config, self.excluded = config, excluded

    def run(self, request: ReplayRequest) -> tuple[int, str, str]:
        """The replay to its end: (srun's exit code, the replay's run directory, its output)."""
        run_dir = str(plan_replay_config(request).config.run_dir.resolve())
        done = subprocess.run(self.command(request), capture_output=True, text=True)
        return done.returncode, run_dir, done.stdout + done.stderr

    def command(self, request: ReplayRequest) -> list[str]:
        """``srun [allocation] PYTHON -m areal_watchdog.cli replay RUN_DIR --step N ...``."""
        config, slurm = self.config, validate_slurm(self.config)
        name = slurm.get("job_name") or f"{config.experiment_name}-{config.trial_name}"
        cpus = slurm.get("cpus_per_task") or config.launch.nproc_per_node
        srun = ["srun", "--nodes=1", "--ntasks=1", f"--job-name={name}-replay",
                f"--time={slurm['time']}", f"--cpus-per-task={cpus}"]  # fmt: skip
        if config.n_gpus_per_node:
            srun.append(f"--gpus-per-node={config.n_gpus_per_node}")
        srun += [f"--{k}={slurm[k]}" for k in ("partition", "account", "qos", "constraint", "mem")
                 if slurm.get(k)]  # fmt: skip
        given = {n for n in str(slurm.get("exclude") or "").split(",") if n}
        if given | self.excluded:
            srun.append("--exclude=" + ",".join(sorted(given | self.excluded)))
        replay = [config.launch.python, "-m", "areal_watchdog.cli", "replay",
                  str(Path(request.run_dir).resolve()), "--step", str(request.step)]  # fmt: skip
        if request.groups is not None:
            replay += ["--groups", format_ranks(request.groups)]
        return [*srun, *container_prefix(slurm), *replay, *request.overrides]
