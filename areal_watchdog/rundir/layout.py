"""Where everything lives inside a run directory: one place for every file name.

A run directory is AReaL's ``<fileroot>/<experiment_name>/<trial_name>``; the watchdog keeps its
state below ``watchdog/`` and its incidents below ``incidents/``.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

INCIDENTS, SUSPECTED = "incidents", "suspected"  # the run directory's folders of reports
ENV_RUN_ID = "AREAL_WATCHDOG_RUN_ID"
ENV_WATCH_DIR = "AREAL_WATCHDOG_DIR"
ENV_NODE = "AREAL_WATCHDOG_NODE"
# A sidecar on a Ray node: its raylet's pid. Every process Ray starts on a node carries its
# raylet's (RAY_RAYLET_PID), which tells apart the nodes of raylets that share one host; the
# Ray job's driver, which Ray starts without it, gives its own command this variable instead.
ENV_RAYLET = "AREAL_WATCHDOG_RAYLET_PID"
ENV_JOB_CONFIG = "AREAL_WATCHDOG_JOB_CONFIG"  # the controller is the process that holds it
ENV_RANK_ROLE = "AREAL_WATCHDOG_RANK_ROLE"  # the AReaL role whose workers are the ranks (actor)
# The write end of a pipe from the local sidecar to its launcher: a HangRequest on it ends
# the job even when the disk is full and the cancel record cannot be written.
ENV_CANCEL_FD = "AREAL_WATCHDOG_CANCEL_FD"


def node_of(env: dict[str, str] | os._Environ[str], default: str) -> str:
    """The node a process runs on: what Slurm told its task (``SLURMD_NODENAME``: two test
    "nodes" may share a host, and a task inherits the launcher's environment), else what our
    launcher exported, else ``default``."""
    return env.get("SLURMD_NODENAME") or env.get(ENV_NODE) or default


# The signal a rank's faulthandler answers with its stacks (ignored by default: a stray one
# harms nothing). It is part of the contract, never read from a file.
COOPERATIVE_SIGNAL = signal.SIGURG


FR_ACTIVE = "active:"  # a Flight Recorder request for the entries in flight only


@dataclass(frozen=True)
class RunLayout:
    """The files of one run directory."""

    run_dir: Path

    @property
    def watch_dir(self) -> Path:
        return self.run_dir / "watchdog"

    @property
    def launch_file(self) -> Path:
        """What the launcher tells the sidecars: run id, world size, watchdog settings."""
        return self.watch_dir / "launch.json"

    @property
    def launch_config(self) -> Path:
        """The whole resolved config as launched; ``areal-launch replay`` starts from it."""
        return self.watch_dir / "launch_config.yaml"

    @property
    def job_config(self) -> Path:
        """The resolved config handed to the training script (our sections removed)."""
        return self.watch_dir / "job_config.yaml"

    @property
    def ranks_dir(self) -> Path:
        """Rank registrations, exit records and cooperative stack files."""
        return self.watch_dir / "ranks"

    @property
    def heartbeats_dir(self) -> Path:
        return self.watch_dir / "heartbeats"

    @property
    def logs_dir(self) -> Path:
        return self.watch_dir / "logs"

    @property
    def ray_driver_log(self) -> Path:
        """The Ray job's driver output (AReaL's launcher and the lines Ray forwards to it)."""
        return self.logs_dir / "ray_driver.log"

    @property
    def ray_cluster_file(self) -> Path:
        """The process groups of the Ray cluster the launcher started for the run."""
        return self.watch_dir / "ray_cluster.json"

    @property
    def torchrun_logs_dir(self) -> Path:
        return self.logs_dir / "torchrun"

    @property
    def flight_recorder_dir(self) -> Path:
        """Flight Recorder dumps and NCCL's per-rank dump pipes."""
        return self.watch_dir / "flight_recorder"

    def fr_trigger(self, rank: int) -> Path:
        """The FIFO a rank's Flight Recorder listener waits on."""
        return self.flight_recorder_dir / f"trigger_rank_{rank}"

    def fr_dump(self, rank: int) -> Path:
        """Where the listener writes the trace it was asked for."""
        return self.flight_recorder_dir / f"fr_rank_{rank}.json"

    def fr_active(self, rank: int) -> Path:
        """Where the listener writes the entries in flight, asked between looks."""
        return self.flight_recorder_dir / f"fr_active_rank_{rank}.json"

    def nccl_pipe(self, rank: int) -> Path:
        """NCCL's own dump pipe (``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` + rank)."""
        return self.flight_recorder_dir / f"pipe_rank_{rank}"

    def nccl_dump(self, rank: int) -> Path:
        """Where NCCL dumps (``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` + rank)."""
        return self.flight_recorder_dir / f"rank_{rank}"

    @property
    def tasks_dir(self) -> Path:
        """Asyncio task dumps: a trigger FIFO and a dump per watched process (by pid)."""
        return self.watch_dir / "tasks"

    def tasks_trigger(self, pid: int) -> Path:
        return self.tasks_dir / f"trigger_{pid}"

    def tasks_dump(self, pid: int) -> Path:
        return self.tasks_dir / f"tasks_{pid}.json"

    @property
    def status_dir(self) -> Path:
        """One status file per node, written by its sidecar."""
        return self.watch_dir / "status"

    @property
    def job_exit_dir(self) -> Path:
        """One file per node, written when the node's torchrun ended: its exit code."""
        return self.watch_dir / "job_exit"

    def job_exit(self, node: str) -> Path:
        return self.job_exit_dir / f"{node}.json"

    @property
    def finished_file(self) -> Path:
        """Written by the leading sidecar once the job ended and its last report is out."""
        return self.watch_dir / "finished.json"

    @property
    def late_finish_dir(self) -> Path:
        """One ``LateFinish`` record per node whose sidecar left work after the job's end."""
        return self.watch_dir / "late_finish"

    def late_finish(self, node: str) -> Path:
        return self.late_finish_dir / f"{node}.json"

    @property
    def slurm_job_file(self) -> Path:
        """The Slurm job that runs this run directory (``slurm`` backend), for status/cancel."""
        return self.watch_dir / "slurm_job.json"

    @property
    def metrics_dir(self) -> Path:
        """One file per node whose sidecar serves metrics over HTTP
        (``sidecar_files/metrics_endpoint.py``)."""
        return self.watch_dir / "metrics"

    @property
    def spool_dir(self) -> Path:
        """Notifications that could not be delivered yet."""
        return self.watch_dir / "spool"

    def live_dirs(self) -> list[Path]:
        """The directories a launch creates before anything starts."""
        return [
            self.ranks_dir,
            self.heartbeats_dir,
            self.logs_dir,
            self.status_dir,
            self.incidents_dir,
            self.flight_recorder_dir,
            self.procs_dir,
        ]

    @property
    def interrupted_file(self) -> Path:
        """Written by the launcher when the user interrupts it: an ending, not a failure."""
        return self.watch_dir / "interrupted.json"

    @property
    def launcher_file(self) -> Path:
        """The launcher's heartbeat, where sidecars cannot watch its pid (Ray's nodes)."""
        return self.watch_dir / "launcher.json"

    @property
    def cancel_file(self) -> Path:
        """A sidecar's ``HangRequest``, written before it ends a hung job (``on_hang: cancel``
        or ``resume``)."""
        return self.watch_dir / "cancelled.json"

    @property
    def attempt_ended_file(self) -> Path:
        """Written by a Slurm batch script that keeps its allocation after a hang
        (``resume.allocation: same``) while it waits for the launcher's decision."""
        return self.watch_dir / "attempt_ended.json"

    @property
    def resume_request_file(self) -> Path:
        """The launcher's decision for that batch script: resume in the allocation, or stop."""
        return self.watch_dir / "resume_request.json"

    @property
    def recovery_file(self) -> Path:
        """Every hang of an ``on_hang: resume`` run and what the launcher decided."""
        return self.watch_dir / "recovery.json"

    @property
    def quarantine_file(self) -> Path:
        """Training rows found to hang, left out of a resumed run (``trajectory.quarantine``)."""
        return self.run_dir / "quarantine.json"

    @property
    def incidents_dir(self) -> Path:
        return self.run_dir / INCIDENTS

    @property
    def suspected_dir(self) -> Path:
        """Looks at a silence that were not confirmed: written like incidents, never posted."""
        return self.run_dir / SUSPECTED

    def registrations(self, node: str) -> Path:
        """One node's rank registrations: a sidecar lists its own node's, never the job's."""
        return self.ranks_dir / "by_node" / node

    def registration(self, rank: int, node: str) -> Path:
        return self.registrations(node) / f"rank_{rank}.json"

    def exit_record(self, rank: int) -> Path:
        return self.ranks_dir / f"rank_{rank}.exit.json"

    def stack_file(self, rank: int) -> Path:
        return self.ranks_dir / f"rank_{rank}.stacks.txt"

    @property
    def procs_dir(self) -> Path:
        """Cooperative stack files and exit records of the processes the ``sitecustomize``
        hook arms (AReaL's controller, workers and servers), by pid."""
        return self.watch_dir / "procs"

    def process_stack_file(self, pid: int) -> Path:
        return self.procs_dir / f"{pid}.stacks.txt"

    def process_exit_record(self, pid: int) -> Path:
        return self.procs_dir / f"{pid}.exit.json"

    def process_role_record(self, pid: int) -> Path:
        """A Ray worker's role, written once AReaL names it (its command line never says)."""
        return self.procs_dir / f"{pid}.role.json"

    def heartbeats(self, node: str) -> Path:
        """One node's heartbeats and pauses (``rundir.progress.beats``)."""
        return self.heartbeats_dir / node

    def node_status(self, node: str) -> Path:
        return self.status_dir / f"{node}.json"
