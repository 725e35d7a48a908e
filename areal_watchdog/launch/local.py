"""The local backend: torchrun on this machine plus one watchdog sidecar process.

``build_local_plan`` turns a config into a LaunchPlan; ``execute_local_plan`` runs it: torchrun
(rank 0's output on the terminal, every rank's output in files), the sidecar beside it, and a
clean shutdown of every process on exit, Ctrl-C or ``on_hang: cancel``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import TextIO

import psutil
import yaml

from areal_watchdog.common.atomic import read_json, write_json_atomic
from areal_watchdog.common.errors import ConfigError
from areal_watchdog.config.debug_env import render_debug_env
from areal_watchdog.config.load import JobConfig
from areal_watchdog.evidence.flight_recorder import ENV_FLIGHT_RECORDER
from areal_watchdog.launch.plan import LaunchPlan, ProcessSpec
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import ENV_NODE, ENV_RUN_ID, ENV_WATCH_DIR, RunLayout
from areal_watchdog.trajectory import format as trajectory

# Exit codes of ``areal-launch`` (docs/cli.md).
EXIT_OK = 0
EXIT_JOB_FAILED = 1
EXIT_USAGE = 2
EXIT_HANG_CANCELLED = 3
EXIT_INTERRUPTED = 130

TERMINATE_GRACE = 20.0  # seconds torchrun gets to stop its ranks before everything is killed
SIDECAR_FINISH_GRACE = 60.0  # seconds the sidecar gets to write a final report


def resolve_entrypoint(config: JobConfig) -> str:
    """A script path made absolute (relative to the working directory, else to the config)."""
    entry = config.launch.entrypoint
    if not entry.endswith(".py"):
        return entry  # a module name
    for base in (Path.cwd(), Path(config.source).resolve().parent):
        candidate = (base / entry).resolve()
        if candidate.is_file():
            return str(candidate)
    raise ConfigError(
        config.source,
        "launch.entrypoint",
        f"no such file: {entry} (looked in the working directory and beside the config)",
    )


def job_environment(
    config: JobConfig, layout: RunLayout, run_id: str, node: str | None, watchdog: bool
) -> dict[str, str]:
    """The variables every rank gets on top of the launcher's environment (``node``: None when
    each node adds its own name, as on Slurm)."""
    env: dict[str, str] = {}
    wd = config.watchdog
    if watchdog:
        env.update(render_debug_env(wd.debug_env, str(layout.watch_dir)))
        env.update(
            {
                ENV_RUN_ID: run_id,
                ENV_WATCH_DIR: str(layout.watch_dir),
                trajectory.ENV_CONFIG_HASH: trajectory.config_hash(config.raw),
            }
        )
        if node is not None:
            env[ENV_NODE] = node
        if wd.flight_recorder:
            env[ENV_FLIGHT_RECORDER] = "1"
        if wd.trajectory_dump:
            env.update(
                {
                    trajectory.ENV_DIR: str(config.trajectory_dir),
                    trajectory.ENV_MAX_KEEP: str(wd.trajectory_max_keep),
                    trajectory.ENV_PIN_STEPS: ",".join(map(str, wd.trajectory_pin_steps)),
                }
            )
            if wd.trajectory_dump_steps is not None:
                env[trajectory.ENV_DUMP_STEPS] = ",".join(map(str, wd.trajectory_dump_steps))
    env.update(config.launch.env)
    return env


def torchrun_output_args(layout: RunLayout, node: str) -> list[str]:
    """Every rank's stdout and stderr to files under the run directory; rank 0's also to the
    terminal."""
    return [
        "--log-dir",
        str(layout.torchrun_logs_dir / node),
        "--redirects",
        "3",
        "--tee",
        "3",
        "--local-ranks-filter",
        "0",
    ]


def rank_command(config: JobConfig, layout: RunLayout, watchdog: bool) -> list[str]:
    """What torchrun starts on every rank: the entrypoint, wrapped when watched."""
    entry = resolve_entrypoint(config)
    tail = [entry, *config.launch.args]
    if config.launch.config_arg:
        tail += [config.launch.config_arg, str(layout.job_config)]
    if watchdog:
        return ["-m", "areal_watchdog.rank.main", *tail]
    return tail if entry.endswith(".py") else ["-m", *tail]


def launch_files(config: JobConfig, info: LaunchInfo, watchdog: bool) -> dict[str, str]:
    """launch.json for the sidecars, the resolved config for the training script, and the whole
    resolved config (our sections included) from which ``areal-launch replay`` starts again."""
    layout = info.layout
    dumping = watchdog and config.watchdog.trajectory_dump
    return {
        str(layout.launch_file): json.dumps(info.to_dict(), indent=1, sort_keys=True),
        str(layout.job_config): yaml.safe_dump(config.job_tree(dumping), sort_keys=False),
        str(layout.launch_config): yaml.safe_dump(
            _with_resolved_entrypoint(config), sort_keys=False
        ),
    }


def _with_resolved_entrypoint(config: JobConfig) -> dict:
    """The whole config with the entrypoint as an absolute path, so a replay runs anywhere."""
    raw = dict(config.raw)
    raw["launch"] = {**raw.get("launch", {}), "entrypoint": resolve_entrypoint(config)}
    return raw


def stale_state(layout: RunLayout) -> list[Path]:
    """What an earlier launch of the same run directory leaves that must not confuse this one."""
    watch = layout.watch_dir
    return [
        layout.ranks_dir,
        layout.heartbeats_dir,
        layout.status_dir,
        layout.job_exit_dir,
        layout.finished_file,
        layout.cancel_file,
        watch / "requests",
        watch / "evidence",
        watch / "claims",
    ]


def build_local_plan(config: JobConfig, watchdog: bool, run_id: str | None = None) -> LaunchPlan:
    """Plan a single-node launch; raises ConfigError before anything starts."""
    run_id = run_id or uuid.uuid4().hex[:12]
    layout = RunLayout(config.run_dir.resolve())
    node = socket.gethostname()
    nproc = config.launch.nproc_per_node
    python = config.launch.python
    info = LaunchInfo.for_config(config, run_id, "local", layout.run_dir, nproc, [node])
    torchrun = [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        *torchrun_output_args(layout, node),
        *rank_command(config, layout, watchdog),
    ]
    processes = [
        ProcessSpec("job", torchrun, job_environment(config, layout, run_id, node, watchdog))
    ]
    if watchdog:
        processes.append(
            ProcessSpec(
                "watchdog",
                [
                    python,
                    "-m",
                    "areal_watchdog.watch.sidecar",
                    "--run-dir",
                    str(layout.run_dir),
                    "--node",
                    node,
                ],
            )
        )
    reset = stale_state(layout)
    return LaunchPlan(
        backend="local",
        run_id=run_id,
        run_dir=str(layout.run_dir),
        files=launch_files(config, info, watchdog),
        processes=processes,
        reset_paths=[str(p) for p in reset],
    )


def prepare_run_dir(plan: LaunchPlan) -> None:
    """Remove the previous launch's live state and write the plan's files."""
    for path in map(Path, plan.reset_paths):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()
    layout = RunLayout(Path(plan.run_dir))
    for directory in (
        layout.ranks_dir,
        layout.heartbeats_dir,
        layout.logs_dir,
        layout.status_dir,
        layout.incidents_dir,
        layout.flight_recorder_dir,
    ):
        directory.mkdir(parents=True, exist_ok=True)
    for path, content in plan.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(content, encoding="utf-8")


def execute_local_plan(plan: LaunchPlan, out: TextIO = sys.stdout) -> int:
    """Run the plan to the end and return areal-launch's exit code."""
    prepare_run_dir(plan)
    layout = RunLayout(Path(plan.run_dir))
    job_spec = plan.processes[0]
    node = job_spec.env.get(ENV_NODE, socket.gethostname())
    agent_log = open(layout.logs_dir / f"torchrun_{node}.log", "a", encoding="utf-8")  # noqa: SIM115
    job = subprocess.Popen(
        job_spec.argv,
        env={**os.environ, **job_spec.env},
        cwd=job_spec.cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    pump = threading.Thread(target=_pump, args=(job.stdout, out, agent_log), daemon=True)
    pump.start()
    sidecar = None
    if len(plan.processes) > 1:
        spec = plan.processes[1]
        sidecar = subprocess.Popen(
            spec.argv,
            env={**os.environ, **spec.env},
            cwd=spec.cwd,
            stdout=out if _has_fileno(out) else None,
            start_new_session=True,
        )
    print(f"[areal-launch] run {plan.run_id}: {plan.run_dir}", file=out, flush=True)
    interrupted = _Interrupt()
    cancelled = False
    try:
        while job.poll() is None:
            if interrupted.signum is not None:
                break
            if not cancelled and isinstance(read_json(layout.cancel_file), dict):
                cancelled = True
                print(
                    "[areal-launch] the watchdog reported a hang (on_hang=cancel): "
                    "terminating the job",
                    file=out,
                    flush=True,
                )
                _stop_job(job, plan.run_id)
            time.sleep(0.2)
    finally:
        interrupted.restore()
        if job.poll() is None:
            _stop_job(job, plan.run_id)
        pump.join(timeout=5)
        agent_log.close()
        layout.job_exit_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(
            layout.job_exit(node),
            {"run_id": plan.run_id, "returncode": job.returncode, "time": time.time()},
        )
        if sidecar is not None:
            _finish_sidecar(sidecar, interrupted.signum is not None)
    if interrupted.signum is not None:
        return EXIT_INTERRUPTED
    if cancelled or isinstance(read_json(layout.cancel_file), dict):
        return EXIT_HANG_CANCELLED
    return EXIT_OK if job.returncode == 0 else EXIT_JOB_FAILED


def _has_fileno(stream: TextIO) -> bool:
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    return True


def _pump(source: TextIO, out: TextIO, log: TextIO) -> None:
    for line in source:
        out.write(line)
        out.flush()
        log.write(line)
        log.flush()


def _stop_job(job: subprocess.Popen[str], run_id: str) -> None:
    """SIGTERM torchrun (it stops its ranks); after a grace period kill whatever is left.

    Ranks that are stopped (SIGSTOP, a debugger detached badly) get SIGCONT so that the
    termination reaches them instead of waiting out the grace period.
    """
    try:
        job.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        for proc in run_processes(run_id):
            with contextlib.suppress(psutil.Error):
                if proc.status() == psutil.STATUS_STOPPED:
                    proc.send_signal(signal.SIGCONT)
        job.wait(timeout=TERMINATE_GRACE)
    except subprocess.TimeoutExpired:
        job.kill()
        job.wait()
    kill_run_processes(run_id)


def _finish_sidecar(sidecar: subprocess.Popen[bytes], interrupted: bool) -> None:
    if interrupted:
        sidecar.send_signal(signal.SIGTERM)
    try:
        sidecar.wait(timeout=SIDECAR_FINISH_GRACE)
    except subprocess.TimeoutExpired:
        sidecar.kill()
        sidecar.wait()


def run_processes(run_id: str) -> list[psutil.Process]:
    """Every process that carries this run id: ranks, their workers, torchrun."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(ENV_RUN_ID) == run_id:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def kill_run_processes(run_id: str) -> list[int]:
    """SIGKILL every process of the run (ranks live in sessions of their own)."""
    killed = []
    for proc in run_processes(run_id):
        with contextlib.suppress(psutil.Error):
            proc.kill()
            killed.append(proc.pid)
    return killed


class _Interrupt:
    """Turns SIGINT/SIGTERM into a flag so the launcher can shut its children down in order."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.signum = signum

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
