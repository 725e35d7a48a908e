"""The Slurm backend: submit through submitit, one torchrun per node, one sidecar per node.

``plan`` builds the LaunchPlan: the complete sbatch script (rendered by submitit's own code),
the torchrun command each node will run (built by the very function the node calls, with the
values only Slurm knows shown as ``$SLURM_*``), and the sidecar command of the setup lines.
``execute`` submits that plan.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from string import Template
from typing import Any, TextIO

from areal_watchdog.common.atomic import write_json_atomic
from areal_watchdog.common.errors import UserError
from areal_watchdog.config.areal_side.entrypoint import launch_mode
from areal_watchdog.config.model import HangAction, JobConfig
from areal_watchdog.launch.planning.job import (
    job_environment,
    launch_files,
    prepare_run_dir,
    rank_command,
    sidecar_command,
    stale_state,
)
from areal_watchdog.launch.planning.plan import LaunchPlan, ProcessSpec
from areal_watchdog.launch.run_handle import Described
from areal_watchdog.launch.slurm.areal import (
    execute_single_controller,
    plan_single_controller,
    spmd_shape,
)
from areal_watchdog.launch.slurm.control import handle
from areal_watchdog.launch.slurm.control.jobs import (
    ACTIVE_STATES,
    JOB_ID,
    job_state,
    recorded_job_id,
    wait_for_job,
)
from areal_watchdog.launch.slurm.control.same_allocation import attempt_ended, request
from areal_watchdog.launch.slurm.node import NodeJob
from areal_watchdog.launch.slurm.options import container_prefix, validate_slurm
from areal_watchdog.launch.slurm.recovery import SlurmRecovery
from areal_watchdog.launch.slurm.scheduler_command import scheduler_command
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.secure import check_run_dir

TEMPLATES = Path(__file__).resolve().parent / "templates"
CONCLUDE_SECONDS = 30  # how long the batch script waits for the sidecars' final word
CONTROLLER_PATIENCE = 300  # seconds an srun whose controller did not answer is tried again
SRUN_RETRY_SECONDS = 10
# What srun says when the controller did not answer before it launched anything (Slurm's own
# messages, src/srun): worth another try, unlike a refused step or a failed task.
CONTROLLER_SILENT = (
    "Unable to (confirm allocation|create step) for job [0-9]+: (Socket timed out|Unable to "
    "contact slurm controller|Zero Bytes were transmitted|Communication connection failure|"
    "Connection refused)"
)


@dataclass(frozen=True)
class Submission:
    """What submitit needs: sbatch parameters, the per-node task, where logs go."""

    parameters: dict[str, Any]
    node_job: NodeJob
    folder: str
    python: str
    keeps_allocation: bool = False  # resume.allocation: same (the batch script waits after a hang)


class SlurmBackend:
    """One sbatch job; a submitit task per node runs torchrun; setup lines start the sidecars."""

    name = "slurm"

    def __init__(self, wait: bool = False) -> None:
        self.wait = wait  # execute follows the job to its end (--wait)
        self.allocation: str | None = None  # the job kept after a hang (allocation: same)
        self._run_dir: Path | None = None
        self.recovery = SlurmRecovery(self)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--wait", action="store_true", help="follow the job; the exit code says how it ended"
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SlurmBackend:
        return cls(wait=args.wait)

    def plan(self, config: JobConfig, watchdog: bool, run_id: str | None = None) -> LaunchPlan:
        """Plan a Slurm launch; raises ConfigError before anything is created or submitted."""
        mode = launch_mode(config)
        if mode == "single_controller":
            return plan_single_controller(config, watchdog, run_id)
        slurm = validate_slurm(config)
        run_id = run_id or uuid.uuid4().hex[:12]
        layout = RunLayout(config.run_dir.resolve())
        prefix = container_prefix(slurm)
        env = job_environment(config, layout, run_id, None, watchdog)  # each node adds its name
        ranks = rank_command(config, layout, watchdog)
        spmd = spmd_shape(config, layout, env, ranks) if mode == "spmd" else None
        nproc = spmd.nproc_per_node if spmd else config.launch.nproc_per_node
        node_job = NodeJob(
            str(layout.run_dir), run_id, config.launch.python, nproc, ranks,
            spmd.trainer_env if spmd else env, watchdog, spmd.servers if spmd else None,
        )  # fmt: skip
        folder = str(layout.logs_dir / "submitit")
        python_cmd = shlex.join([*prefix, config.launch.python])
        parameters = _sbatch_parameters(
            config, slurm, layout, prefix, watchdog, nproc, folder, python_cmd
        )
        script = render_sbatch(parameters, folder, python_cmd)
        processes = _node_processes(config, layout, node_job, prefix, watchdog)
        n_ranks = spmd.world_size if spmd else config.n_nodes * nproc
        info = LaunchInfo.for_config(config, run_id, "slurm", layout.run_dir, n_ranks, [], mode)
        info = replace(info, scheduler_command=scheduler_command(config.launch.python))
        info = replace(info, nproc_per_node=nproc)
        return LaunchPlan(
            backend=self.name,
            run_id=run_id,
            run_dir=str(layout.run_dir),
            files=launch_files(config, info, watchdog, spmd.tree if spmd else None),
            processes=processes,
            reset_paths=[str(p) for p in stale_state(layout)] + (spmd.reset_paths if spmd else []),
            dirs=spmd.dirs if spmd else [],
            notes=[f"sbatch script (submitted through submitit, logs in {folder}):", "", script],
            payload=Submission(
                parameters, node_job, folder, python_cmd, _keeps_allocation(config, watchdog)
            ),
            dir_mode=config.launch.run_dir_mode,
            mode=mode,
        )

    def execute(self, plan: LaunchPlan, out: TextIO = sys.stdout) -> int:
        """Submit (or, after a hang, run again in the kept allocation); with ``--wait``
        follow the job and return how it, or with ``allocation: same`` its attempt, ended."""
        if plan.mode == "single_controller":
            return execute_single_controller(plan, out)
        submission: Submission = plan.payload
        run_dir = Path(plan.run_dir)
        if self.allocation and attempt_ended(RunLayout(run_dir), self.allocation):
            job_id = _rerun_in_allocation(plan, self.allocation, submission.folder)
            print(f"[areal-launch] resuming in job {job_id}'s allocation", file=out, flush=True)
        else:
            job_id = submit(plan)
            logs = RunLayout(run_dir).logs_dir
            print(
                f"[areal-launch] submitted job {job_id}\n"
                f"  run dir: {plan.run_dir}\n"
                f"  logs:    {submission.folder}/{job_id}_*_log.out, {logs}\n"
                f"  follow:  areal-launch status {job_id}",
                file=out,
                flush=True,
            )
        if not self.wait:
            return 0
        if submission.keeps_allocation:
            self.allocation, self._run_dir = job_id, run_dir
        return wait_for_job(job_id, run_dir, attempts=submission.keeps_allocation)

    @classmethod
    def recognises(cls, run_dir: Path) -> bool:
        return handle.recognises(run_dir)

    @classmethod
    def recognises_job(cls, text: str) -> bool:
        return JOB_ID.fullmatch(text) is not None

    @classmethod
    def describe(cls, target: str) -> Described:
        return handle.describe(target)

    @classmethod
    def cancel(cls, target: str) -> str:
        return handle.cancel(target)

    def release(self) -> None:
        """A batch script still waiting for a decision ends its job."""
        if self.allocation and self._run_dir:
            layout = RunLayout(self._run_dir)
            if attempt_ended(layout, self.allocation):
                request(layout, self.allocation, "stop", "", {})
        self.allocation = None


def _keeps_allocation(config: JobConfig, watchdog: bool) -> bool:
    wd = config.watchdog
    return watchdog and wd.on_hang is HangAction.RESUME and wd.resume.allocation == "same"


def _rerun_in_allocation(plan: LaunchPlan, job_id: str, folder: str) -> str:
    """The resumed plan's files in place of the last attempt's, and the batch script of
    ``job_id`` told to run the job's step again with its run id and resume variables."""
    prepare_run_dir(plan)
    _record_job(plan, job_id, folder)
    submission: Submission = plan.payload
    ours = {k: v for k, v in submission.node_job.env.items() if k.startswith("AREAL_WATCHDOG_")}
    request(RunLayout(Path(plan.run_dir)), job_id, "resume", plan.run_id, ours)
    return job_id


def _node_processes(
    config: JobConfig, layout: RunLayout, node_job: NodeJob, prefix: list[str], watchdog: bool
) -> list[ProcessSpec]:
    """What the dry run shows: each node's task (the server launcher on SPMD's first nodes,
    torchrun on the others, with the values only Slurm knows as ``$SLURM_*``) and the sidecars."""
    servers = node_job.servers
    n_trainers = config.n_nodes - (servers.count if servers else 0)
    processes = []
    if servers is not None:
        name = f"servers: AReaL's server launcher on the first {servers.count} node(s)"
        processes.append(ProcessSpec(name, servers.argv, servers.env, kind="service"))
    processes.append(
        ProcessSpec(
            f"job: one torchrun per node on {n_trainers} node(s) (submitit task)",
            node_job.preview(n_trainers),
            node_job.env,
            after=servers.gate if servers else None,
        )  # fmt: skip
    )
    if watchdog:
        sidecar = sidecar_command(config.launch.python, layout.run_dir, "--node-from-scheduler")
        processes.append(
            ProcessSpec(
                "watchdog: one sidecar per node (the setup lines)",
                [*prefix, *sidecar],
                kind="watchdog",
            )
        )
    return processes


def _sbatch_parameters(
    config: JobConfig, slurm: dict[str, Any], layout: RunLayout, prefix: list[str],
    watchdog: bool, nproc: int, folder: str, python_cmd: str,
) -> dict[str, Any]:  # fmt: skip
    """submitit's parameters, the rendered setup and teardown lines included."""
    parameters: dict[str, Any] = {
        "job_name": slurm.get("job_name") or f"{config.experiment_name}-{config.trial_name}",
        "nodes": config.n_nodes,
        "ntasks_per_node": 1,
        "time": slurm["time"],
        "cpus_per_task": slurm.get("cpus_per_task") or nproc,
        "srun_args": [str(a) for a in slurm.get("srun_args") or []],
        "comment": f"areal-watchdog:{layout.run_dir}",
        "additional_parameters": dict(slurm.get("additional_parameters") or {}),
        "stderr_to_stdout": True,
    }
    if config.n_gpus_per_node:
        parameters["gpus_per_node"] = config.n_gpus_per_node
    for key in ("partition", "account", "qos", "constraint", "nodelist", "exclude", "mem"):
        if slurm.get(key):
            parameters[key] = slurm[key]
    if slurm.get("exclusive"):
        parameters["exclusive"] = True
    if not watchdog:
        return {**parameters, "setup": [], "teardown": []}
    job_step = _job_step(parameters, folder, python_cmd)
    values = _template_values(slurm, layout, config.n_nodes, prefix, config.launch.python, job_step)
    same = _keeps_allocation(config, watchdog)
    teardown = "slurm_teardown_same_allocation.sh" if same else "slurm_teardown.sh"
    return {
        **parameters,
        "setup": _template_lines(slurm, "slurm_setup.sh", values),
        "teardown": _template_lines(slurm, teardown, values),
    }


def _job_step(parameters: dict[str, Any], folder: str, python_cmd: str) -> str:
    """submitit's ``srun`` line, as a step run again in the same allocation runs it (its log
    appended to, not replaced)."""
    script = render_sbatch({**parameters, "setup": [], "teardown": []}, folder, python_cmd)
    (line,) = [line for line in script.splitlines() if line.startswith("srun ")]
    return line.replace("srun ", "srun --open-mode=append ", 1)


def _template_values(
    slurm: dict[str, Any], layout: RunLayout, n_nodes: int, prefix: list[str], python: str,
    job_step: str,
) -> dict[str, str]:  # fmt: skip
    """What the sbatch templates may name."""
    container = f"{shlex.join(prefix)} " if prefix else ""
    srun_args = "".join(f"{shlex.quote(str(a))} " for a in slurm.get("srun_args") or [])
    logs = shlex.quote(str(layout.logs_dir))
    sidecar = shlex.join(sidecar_command(python, layout.run_dir, "--node-from-scheduler"))
    return {
        "run_dir": shlex.quote(str(layout.run_dir)),
        "logs_dir": logs,
        "finished_file": shlex.quote(str(layout.finished_file)),
        "cancel_file": shlex.quote(str(layout.cancel_file)),
        "conclude_seconds": f"{CONCLUDE_SECONDS:g}",
        "controller_patience": str(CONTROLLER_PATIENCE),
        "srun_retry_seconds": str(SRUN_RETRY_SECONDS),
        "controller_silent": CONTROLLER_SILENT,
        "n_nodes": str(n_nodes),
        "python": shlex.quote(python),
        "container_prefix": container,
        "sidecar_srun_args": srun_args,
        "sidecar_step": (
            f"srun --overlap --nodes={n_nodes} --ntasks={n_nodes} --ntasks-per-node=1 "
            f"--kill-on-bad-exit=0 --no-kill --output={logs}/sidecar_%N-%t.out "
            f"--open-mode=append {srun_args}{container}{sidecar}"
        ),
        "job_step": job_step,
    }


def _template_lines(slurm: dict[str, Any], name: str, values: dict[str, str]) -> list[str]:
    """A template from ``TEMPLATES`` (or ``launch.slurm.template_dir``), rendered."""
    path = Path(slurm.get("template_dir") or TEMPLATES) / name
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot read the sbatch template: {exc.strerror}") from None
    try:
        return Template(text).substitute(values).rstrip("\n").splitlines()
    except (KeyError, ValueError) as exc:
        raise UserError(f"{path}: bad template placeholder {exc}") from None


def render_sbatch(parameters: dict[str, Any], folder: str, python_cmd: str) -> str:
    """The sbatch script submitit will write, from submitit's own renderer."""
    from submitit.slurm.slurm import _make_sbatch_string

    command = f"{python_cmd} -u -m submitit.core._submit {shlex.quote(folder)}"
    return _make_sbatch_string(command=command, folder=folder, **parameters)


def submit(plan: LaunchPlan) -> str:
    """Prepare the run directory and submit the plan's job; return the job id."""
    if shutil.which("sbatch") is None:
        raise UserError(
            "sbatch is not on PATH: run on a Slurm login node (or try "
            "scripts/slurm-cluster.sh up for a local test cluster)"
        )
    import submitit

    submission: Submission = plan.payload
    _refuse_if_running(Path(plan.run_dir))
    prepare_run_dir(plan)
    executor = submitit.SlurmExecutor(
        folder=submission.folder, max_num_timeout=0, python=submission.python
    )
    executor.update_parameters(**submission.parameters)
    try:
        job = executor.submit(submission.node_job)
    except Exception as exc:  # noqa: BLE001 - sbatch's own message is the useful part
        raise UserError(f"sbatch refused the job: {str(exc).strip()[:600]}") from None
    _record_job(plan, str(job.job_id), submission.folder)
    return str(job.job_id)


def _refuse_if_running(run_dir: Path) -> None:
    """A second submission into a run directory whose job still runs is refused."""
    if not run_dir.exists():
        return
    job_id = recorded_job_id(check_run_dir(run_dir))
    state = job_state(job_id).get("JobState", "") if job_id else ""
    if state in ACTIVE_STATES:
        raise UserError(
            f"{run_dir}: already in use by Slurm job {job_id} ({state}); cancel it "
            "(areal-launch cancel) or choose another trial_name"
        )


def _record_job(plan: LaunchPlan, job_id: str, folder: str) -> None:
    """Tell the sidecars and ``status``/``cancel`` which Slurm job runs this run directory."""
    layout = RunLayout(Path(plan.run_dir))
    info = json.loads(plan.files[str(layout.launch_file)])
    info["job_id"] = job_id
    write_json_atomic(layout.launch_file, info)
    record = {"job_id": job_id, "run_id": plan.run_id, "submitted_at": time.time(), "logs": folder}
    write_json_atomic(layout.slurm_job_file, record)
