"""The replay that decides a Slurm resume, on one node the run's hangs did not name.

``srun`` runs ``areal-launch replay`` (the local backend on that node, watched) as a step of the
job's own allocation when it kept one (``watchdog.resume.allocation: same``) and one of its
nodes was not named, else in a one-node allocation of its own with the job's partition,
account, time and per-node resources: a replay on the node that failed could not tell the data
from the node. Its terminal output is the replay's log.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from areal_watchdog.common.rankset import format_ranks
from areal_watchdog.config.model import JobConfig
from areal_watchdog.launch.slurm.control.jobs import expand_nodelist, job_state
from areal_watchdog.launch.slurm.options import container_prefix, validate_slurm
from areal_watchdog.trajectory.replay.replay_plan import ReplayRequest, plan_replay_config

NEW_ALLOCATION = "on a node of a one-node Slurm allocation"


class SlurmReplayHost:
    """Where a replay runs on Slurm: a node of ``allocation`` (a job id) the hangs did not
    name, else a one-node allocation without the ``excluded`` nodes."""

    def __init__(
        self, config: JobConfig, excluded: set[str], allocation: str | None = None
    ) -> None:
        self.config, self.excluded = config, excluded
        self.nodes = allocation_nodes(allocation) if allocation else []
        self.allocation = allocation if set(self.nodes) - excluded else None
        self.where = (
            f"on a node of job {allocation}'s allocation" if self.allocation else NEW_ALLOCATION
        )

    def run(self, request: ReplayRequest) -> tuple[int, str, str]:
        """The replay to its end: (srun's exit code, the replay's run directory, its output)."""
        run_dir = str(plan_replay_config(request).config.run_dir.resolve())
        done = subprocess.run(self.command(request), capture_output=True, text=True)
        return done.returncode, run_dir, done.stdout + done.stderr

    def command(self, request: ReplayRequest) -> list[str]:
        """``srun [where] PYTHON -m areal_watchdog.cli replay RUN_DIR --step N ...``."""
        config, slurm_options = self.config, validate_slurm(self.config)
        cpus = slurm_options.get("cpus_per_task") or config.launch.nproc_per_node
        srun = ["srun", "--nodes=1", "--ntasks=1", f"--cpus-per-task={cpus}"]
        srun += self._in_allocation() if self.allocation else self._new_allocation(slurm_options)
        replay = [config.launch.python, "-m", "areal_watchdog.cli", "replay",
                  str(Path(request.run_dir).resolve()), "--step", str(request.step)]  # fmt: skip
        if request.groups is not None:
            replay += ["--groups", format_ranks(request.groups)]
        if request.groups_of is not None:
            replay += ["--groups-of", str(request.groups_of)]
        return [*srun, *container_prefix(slurm_options), *replay, *request.overrides]

    def _in_allocation(self) -> list[str]:
        """A step of the kept allocation, on none of its nodes the hangs named."""
        named = sorted(self.excluded & set(self.nodes))
        return [f"--jobid={self.allocation}", *([f"--exclude={','.join(named)}"] if named else [])]

    def _new_allocation(self, options: dict) -> list[str]:
        """The job's partition, account, time and per-node resources, without the named nodes
        and the config's own exclusions."""
        config = self.config
        name = options.get("job_name") or f"{config.experiment_name}-{config.trial_name}"
        srun = [f"--job-name={name}-replay", f"--time={options['time']}"]
        if config.n_gpus_per_node:
            srun.append(f"--gpus-per-node={config.n_gpus_per_node}")
        srun += [f"--{k}={options[k]}" for k in ("partition", "account", "qos", "constraint", "mem")
                 if options.get(k)]  # fmt: skip
        given = {n for n in str(options.get("exclude") or "").split(",") if n}
        if given | self.excluded:
            srun.append("--exclude=" + ",".join(sorted(given | self.excluded)))
        return srun


def allocation_nodes(job_id: str) -> list[str]:
    """The nodes of a running job's allocation (none when Slurm no longer knows it)."""
    nodelist = job_state(job_id).get("NodeList", "")
    if not nodelist or nodelist == "(null)":
        return []
    return expand_nodelist(nodelist)
