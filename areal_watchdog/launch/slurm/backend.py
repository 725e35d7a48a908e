"""The Slurm backend: submit through submitit, one torchrun per node, one sidecar per node.

``build_slurm_plan`` turns a config into a plan (the complete sbatch script included, rendered
by submitit's own code, so ``--dry-run`` shows exactly what would be submitted);
``submit_slurm_plan`` submits it. ``job_state``, ``wait_for_job`` and ``cancel_job`` follow and
end a job by id.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any

from areal_watchdog.common.atomic import read_json, write_json_atomic
from areal_watchdog.common.errors import ConfigError, UserError
from areal_watchdog.config.load import JobConfig
from areal_watchdog.launch.local import (
    EXIT_HANG_CANCELLED,
    EXIT_JOB_FAILED,
    EXIT_OK,
    job_environment,
    launch_files,
    prepare_run_dir,
    rank_command,
    stale_state,
)
from areal_watchdog.launch.plan import LaunchPlan, ProcessSpec
from areal_watchdog.launch.slurm.node import NodeJob
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import RunLayout

TEMPLATES = Path(__file__).resolve().parent / "templates"
CONCLUDE_SECONDS = 30  # how long the batch script waits for the sidecars' final word
EXIT_CANCELLED = 4
EXIT_TIMEOUT = 5
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
_TIME = re.compile(r"^(?:(?P<d>\d+)-)?(?:(?P<h>\d+):)?(?P<m>\d+)(?::(?P<s>\d+))?$")


@dataclass(frozen=True)
class SlurmPlan:
    """A Slurm launch: the generic plan, the sbatch parameters and the per-node job."""

    plan: LaunchPlan
    parameters: dict[str, Any]
    node_job: NodeJob
    submitit_folder: str
    python: str
    sbatch_script: str = field(repr=False)


def parse_time_minutes(value: int | str, source: str) -> int:
    """``90``, ``"90"``, ``"1:30:00"`` or ``"1-00:00:00"`` -> minutes."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ConfigError(
                source, "launch.slurm.time", f"must be at least 1 minute, got {value}"
            )
        return value
    match = _TIME.match(str(value).strip())
    if not match:
        raise ConfigError(
            source, "launch.slurm.time", f"must be minutes or [D-]HH:MM[:SS], got {value!r}"
        )
    days, hours = int(match["d"] or 0), int(match["h"] or 0)
    minutes, seconds = int(match["m"]), int(match["s"] or 0)
    if match["h"] is None and match["s"] is not None:  # "MM:SS"
        hours, minutes, seconds = 0, minutes, seconds
    total = days * 1440 + hours * 60 + minutes + (1 if seconds else 0)
    if total < 1:
        raise ConfigError(source, "launch.slurm.time", f"must be at least 1 minute, got {value!r}")
    return total


def validate_slurm(config: JobConfig) -> dict[str, Any]:
    """``launch.slurm`` checked key by key; a ConfigError names the key before anything runs."""
    section = dict(config.launch.slurm)
    for key, value in section.items():
        if key not in SLURM_KEYS:
            raise ConfigError(
                config.source,
                f"launch.slurm.{key}",
                f"is not a known key; known: {', '.join(sorted(SLURM_KEYS))}",
            )
        expected = SLURM_KEYS[key]
        if value is not None and (
            not isinstance(value, expected) or (expected is int and isinstance(value, bool))
        ):
            names = (
                expected.__name__
                if isinstance(expected, type)
                else " or ".join(t.__name__ for t in expected)
            )
            raise ConfigError(
                config.source, f"launch.slurm.{key}", f"must be a {names}, got {value!r}"
            )
    if section.get("cpus_per_task") is not None and section["cpus_per_task"] < 1:
        raise ConfigError(config.source, "launch.slurm.cpus_per_task", "must be at least 1")
    if section.get("mem") is not None and not re.fullmatch(r"\d+[KMGT]?B?", str(section["mem"])):
        raise ConfigError(
            config.source,
            "launch.slurm.mem",
            f"must look like 64G or 4000M, got {section['mem']!r}",
        )
    section["time"] = parse_time_minutes(section.get("time", 60), config.source)
    return section


def build_slurm_plan(config: JobConfig, watchdog: bool, run_id: str | None = None) -> SlurmPlan:
    """Plan a Slurm launch; raises ConfigError before anything is created or submitted."""
    slurm = validate_slurm(config)
    run_id = run_id or uuid.uuid4().hex[:12]
    layout = RunLayout(config.run_dir.resolve())
    n_nodes, nproc = config.n_nodes, config.launch.nproc_per_node
    prefix = slurm.get("container_prefix") or []
    prefix = shlex.split(prefix) if isinstance(prefix, str) else [str(p) for p in prefix]
    python_cmd = shlex.join([*prefix, config.launch.python])
    info = LaunchInfo.for_config(config, run_id, "slurm", layout.run_dir, n_nodes * nproc, [])
    env = job_environment(config, layout, run_id, None, watchdog)  # the node task adds its name
    node_job = NodeJob(
        run_dir=str(layout.run_dir),
        run_id=run_id,
        python=config.launch.python,
        nproc_per_node=nproc,
        rank_command=rank_command(config, layout, watchdog),
        env=env,
        watchdog=watchdog,
    )
    values = _template_values(slurm, layout, n_nodes, prefix, config.launch.python)
    setup = _template_lines(slurm, "slurm_setup.sh", values) if watchdog else []
    teardown = _template_lines(slurm, "slurm_teardown.sh", values) if watchdog else []
    folder = str(layout.logs_dir / "submitit")
    parameters: dict[str, Any] = {
        "job_name": slurm.get("job_name") or f"{config.experiment_name}-{config.trial_name}",
        "nodes": n_nodes,
        "ntasks_per_node": 1,
        "time": slurm["time"],
        "cpus_per_task": slurm.get("cpus_per_task") or nproc,
        "setup": setup,
        "teardown": teardown,
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
    script = render_sbatch(parameters, folder, python_cmd)
    torchrun = [
        config.launch.python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(n_nodes),
        "--node-rank",
        "<SLURM_NODEID>",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "<first node's NodeAddr>",
        "--master-port",
        "<20000 + job id>",
        "...",
        *node_job.rank_command,
    ]
    processes = [ProcessSpec("job: one torchrun per node (submitit task)", torchrun, env)]
    if watchdog:
        processes.append(
            ProcessSpec(
                "watchdog: one sidecar per node (srun --overlap, from the sbatch setup lines)",
                [
                    *prefix,
                    config.launch.python,
                    "-m",
                    "areal_watchdog.watch.sidecar",
                    "--run-dir",
                    str(layout.run_dir),
                    "--node-from-slurm",
                ],
            )
        )
    plan = LaunchPlan(
        backend="slurm",
        run_id=run_id,
        run_dir=str(layout.run_dir),
        files=launch_files(config, info, watchdog),
        processes=processes,
        reset_paths=[str(p) for p in stale_state(layout)],
        notes=[f"sbatch script (submitted through submitit, logs in {folder}):", "", script],
    )
    return SlurmPlan(plan, parameters, node_job, folder, python_cmd, script)


def _template_values(
    slurm: dict[str, Any], layout: RunLayout, n_nodes: int, prefix: list[str], python: str
) -> dict[str, str]:
    """What the sbatch templates may name."""
    return {
        "run_dir": shlex.quote(str(layout.run_dir)),
        "logs_dir": shlex.quote(str(layout.logs_dir)),
        "finished_file": shlex.quote(str(layout.finished_file)),
        "conclude_seconds": f"{CONCLUDE_SECONDS:g}",
        "n_nodes": str(n_nodes),
        "python": shlex.quote(python),
        "container_prefix": f"{shlex.join(prefix)} " if prefix else "",
        "sidecar_srun_args": "".join(
            f"{shlex.quote(str(a))} " for a in slurm.get("srun_args") or []
        ),
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


def submit_slurm_plan(slurm_plan: SlurmPlan) -> str:
    """Prepare the run directory and submit; return the job id."""
    if shutil.which("sbatch") is None:
        raise UserError(
            "sbatch is not on PATH: run on a Slurm login node (or try "
            "scripts/slurm-cluster.sh up for a local test cluster)"
        )
    import submitit

    plan = slurm_plan.plan
    prepare_run_dir(plan)
    executor = submitit.SlurmExecutor(
        folder=slurm_plan.submitit_folder, max_num_timeout=0, python=slurm_plan.python
    )
    executor.update_parameters(**slurm_plan.parameters)
    try:
        job = executor.submit(slurm_plan.node_job)
    except Exception as exc:  # noqa: BLE001 - sbatch's own message is the useful part
        raise UserError(f"sbatch refused the job: {str(exc).strip()[:600]}") from None
    layout = RunLayout(Path(plan.run_dir))
    info = json.loads(plan.files[str(layout.launch_file)])
    info["job_id"] = str(job.job_id)
    write_json_atomic(layout.launch_file, info)
    write_json_atomic(
        layout.watch_dir / "slurm_job.json",
        {
            "job_id": str(job.job_id),
            "run_id": plan.run_id,
            "submitted_at": time.time(),
            "logs": slurm_plan.submitit_folder,
        },
    )
    return str(job.job_id)


def job_state(job_id: str) -> dict[str, str]:
    """``scontrol show job``'s fields (JobState, Reason, NodeList, Comment...); empty if purged."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        return {}
    return dict(re.findall(r"(\w+)=(\S*)", out.stdout))


def resolve_job(target: str) -> tuple[str, Path | None]:
    """A run directory or a job id -> (job id, run directory if known)."""
    path = Path(target)
    if path.is_dir():
        record = read_json(RunLayout(path).watch_dir / "slurm_job.json")
        if not isinstance(record, dict):
            raise UserError(f"{target}: no Slurm job was submitted from this run directory")
        return str(record["job_id"]), path
    if not target.isdigit():
        raise UserError(f"{target}: neither a run directory nor a Slurm job id")
    comment = job_state(target).get("Comment", "")
    run_dir = Path(comment.split(":", 1)[1]) if comment.startswith("areal-watchdog:") else None
    return target, run_dir


def wait_for_job(job_id: str, run_dir: Path, poll: float = 2.0, out=print) -> int:
    """Follow a job to its end; the exit code says how it ended (see docs/cli.md)."""
    last = None
    while True:
        state = job_state(job_id).get("JobState", "UNKNOWN")
        if state != last:
            out(f"[areal-launch] job {job_id}: {state}")
            last = state
        if state not in (
            "PENDING",
            "CONFIGURING",
            "RUNNING",
            "COMPLETING",
            "REQUEUED",
            "RESIZING",
            "SUSPENDED",
        ):
            break
        time.sleep(poll)
    if isinstance(read_json(RunLayout(run_dir).cancel_file), dict):
        return EXIT_HANG_CANCELLED
    return {"COMPLETED": EXIT_OK, "CANCELLED": EXIT_CANCELLED, "TIMEOUT": EXIT_TIMEOUT}.get(
        state, EXIT_JOB_FAILED
    )


def cancel_job(job_id: str) -> None:
    out = subprocess.run(["scancel", job_id], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise UserError(f"scancel {job_id} failed: {out.stderr.strip()}")


def node_statuses(run_dir: Path) -> list[dict[str, Any]]:
    """Every node's last published status, as the sidecars wrote it."""
    layout = RunLayout(run_dir)
    if not layout.status_dir.is_dir():
        return []
    statuses = [read_json(p) for p in sorted(layout.status_dir.glob("*.json"))]
    return [s for s in statuses if isinstance(s, dict)]
