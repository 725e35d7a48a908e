"""The local backend: torchrun on this machine plus one watchdog sidecar process.

``plan`` turns a config into a LaunchPlan; ``execute`` runs it: torchrun (rank 0's output on
the terminal, every rank's output in files), the sidecar beside it (restarted if it dies), and a
clean shutdown of every process on exit, Ctrl-C, SIGHUP or ``on_hang: cancel``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from areal_watchdog.common.atomic import open_append, read_json, write_json_atomic
from areal_watchdog.common.interprocess.ports import free_port
from areal_watchdog.common.secrets.mask import Mask
from areal_watchdog.config.areal_side.entrypoint import launch_mode
from areal_watchdog.config.model import JobConfig
from areal_watchdog.launch.exit_codes import ExitCode
from areal_watchdog.launch.planning.areal import ArealJob, plan_areal
from areal_watchdog.launch.planning.gate import pass_gate
from areal_watchdog.launch.planning.job import (
    job_environment,
    launch_files,
    prepare_run_dir,
    rank_command,
    sidecar_command,
    stale_state,
)
from areal_watchdog.launch.planning.plan import Gate, LaunchPlan, ProcessSpec
from areal_watchdog.launch.planning.torchrun import standalone, torchrun_command
from areal_watchdog.launch.processes import (
    Interrupts,
    OutputPump,
    blocked_in_kernel,
    start,
    stop_job,
)
from areal_watchdog.launch.recovery import Recovery
from areal_watchdog.launch.run_handle import KnownByRunDir
from areal_watchdog.rundir.job_mask import job_mask
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import ENV_CANCEL_FD, ENV_NODE, RunLayout, node_of
from areal_watchdog.rundir.run_processes import kill_run_processes
from areal_watchdog.rundir.sidecar_files.hang_request import HangRequest

# Seconds from the job's end to the launcher's return: the sidecar's last word (a failure's
# report) comes within them, and what it still draws or sends goes on in its late finish.
JOB_END_BUDGET_S = 9.0
SIDECAR_STOP_S = 1.0  # after the budget: a SIGTERM, this long, then SIGKILL
SIDECAR_RESTARTS = 3  # a sidecar that keeps dying is given up on, loudly


class LocalBackend(KnownByRunDir):
    """torchrun and a sidecar on this machine."""

    name = "local"
    run_note = " (local run, no Slurm job)"
    recovery = Recovery()  # nothing kept between a hang and a resume, the replay on this node

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """No options of its own."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LocalBackend:
        return cls()

    def plan(self, config: JobConfig, watchdog: bool, run_id: str | None = None) -> LaunchPlan:
        """Plan a single-node launch; raises ConfigError before anything starts."""
        run_id = run_id or uuid.uuid4().hex[:12]
        layout = RunLayout(config.run_dir.resolve())
        node = node_of(os.environ, socket.gethostname())  # Slurm's name inside an allocation
        mode = launch_mode(config)
        env = job_environment(config, layout, run_id, node, watchdog)
        ranks = rank_command(config, layout, watchdog)
        if mode == "torchrun":
            nproc = config.launch.nproc_per_node
            torchrun = torchrun_command(
                config.launch.python, layout, node, nproc, standalone(), ranks
            )
            log = str(layout.logs_dir / f"torchrun_{node}.log")
            job = ArealJob([ProcessSpec("job", torchrun, env, log=log)], {}, nproc, None)
            tree = None
        else:
            job = plan_areal(config, mode, self.name, layout, env, ranks, node)
            tree = job.tree
        info = with_metrics_port(
            LaunchInfo.for_config(
                config, run_id, "local", layout.run_dir, job.world_size, [node], mode, job.rank_role
            )
        )
        processes = list(job.processes)
        if watchdog:
            sidecar = sidecar_command(config.launch.python, layout.run_dir, "--node", node)
            processes.append(ProcessSpec("watchdog", sidecar, kind="watchdog"))
        return LaunchPlan(
            backend=self.name,
            run_id=run_id,
            run_dir=str(layout.run_dir),
            files=launch_files(config, info, watchdog, tree),
            processes=processes,
            reset_paths=[str(p) for p in stale_state(layout)] + job.reset_paths,
            dirs=job.dirs,
            dir_mode=config.launch.run_dir_mode,
            mode=mode,
        )

    def execute(self, plan: LaunchPlan, out: TextIO = sys.stdout) -> int:
        """Run the plan to the end and return areal-launch's exit code."""
        return _LocalRun(plan, out).run()

    def release(self) -> None:
        """Nothing outlives a run here."""


def with_metrics_port(info: LaunchInfo) -> LaunchInfo:
    """A metrics endpoint on a port left to us gets a free one now, in the plan: ``--dry-run``
    shows it and ``launch.json`` carries it to the sidecar."""
    metrics = info.watchdog.metrics
    if not metrics.http or metrics.port:
        return info
    chosen = replace(metrics, port=free_port(metrics.host))
    return replace(info, watchdog=replace(info.watchdog, metrics=chosen))


class _LocalRun:
    """One execution of a local plan: the job, its sidecar, and how the run ends."""

    def __init__(self, plan: LaunchPlan, out: TextIO) -> None:
        self.plan, self.out = plan, out
        self.layout = RunLayout(Path(plan.run_dir))
        self.node = plan.main().env.get(ENV_NODE, socket.gethostname())
        self.sidecar: _Sidecar | None = None
        self.cancelled = False
        self.cancel_incident: str | None = None  # as the sidecar said it through the pipe
        self.cancel_pipe = os.pipe()  # the sidecar's cancel needs no disk (ENV_CANCEL_FD)
        os.set_blocking(self.cancel_pipe[0], False)

    def say(self, message: str) -> None:
        print(f"[areal-launch] {message}", file=self.out, flush=True)

    def run(self) -> int:
        held = prepare_run_dir(self.plan, lock=True)  # released when this process ends
        mask = job_mask(self.layout, {**os.environ, **self.plan.main().env})
        services = [_Piped(spec, self.out, mask) for spec in self.plan.of_kind("service")]
        for spec in self.plan.of_kind("watchdog"):
            self.sidecar = _Sidecar(spec, self.out, self.say, self.cancel_pipe[1])
        self.say(f"run {self.plan.run_id}: {self.plan.run_dir}")
        interrupts = Interrupts()
        interrupts.on_second = lambda: kill_run_processes(self.plan.run_id)
        job: _Piped | None = None
        try:
            spec = self.plan.main()
            extra = _gate_values(spec.after, services, interrupts, self.say) if spec.after else {}
            if extra is not None:
                job = _Piped(spec, self.out, mask, extra)
                self.supervise(job, interrupts)
        finally:
            interrupts.restore()
            grace = 1.0 if interrupts.count > 1 else 20.0
            ended = time.monotonic() if job is not None and job.proc.poll() is not None else None
            for piped in [p for p in (job, *services) if p is not None]:
                piped.stop(self.plan.run_id, grace)
            returncode = job.proc.returncode if job is not None else 1
            self.say_unkillable()
            recorded = self.record_exit(returncode)
            if self.sidecar is not None:  # without the record, only a signal tells it the end
                self.sidecar.finish(interrupts.count > 0 or not recorded, ended or time.monotonic())
            if held is not None:
                os.close(held)
            for fd in self.cancel_pipe:
                os.close(fd)
        return self.exit_code(returncode, interrupts.count > 0)

    def say_unkillable(self) -> None:
        """Processes of the job that no signal ends (blocked in the kernel on storage that does
        not answer): the user must know they are still there, and until when."""
        stuck = sorted(blocked_in_kernel(self.plan.run_id))
        if stuck:
            self.say(
                f"{len(stuck)} process(es) of the job (pid {', '.join(map(str, stuck[:8]))}) are "
                "blocked in the kernel on a file whose storage does not answer: no signal ends "
                "them, SIGKILL included, until it answers; they end then (a SIGKILL is pending)"
            )

    def supervise(self, job: _Piped, interrupts: Interrupts) -> None:
        """Until the job ends: act on an interrupt, on the watchdog's cancel, on a dead sidecar."""
        while job.proc.poll() is None:
            if interrupts.count:
                self.say("interrupted: stopping the job (again to kill it at once)")
                job.pump.mute()  # torchrun's traceback about our SIGTERM is noise here
                record = {"run_id": self.plan.run_id, "time": time.time()}
                with contextlib.suppress(OSError):
                    write_json_atomic(self.layout.interrupted_file, record)
                return
            if not self.cancelled and self.cancel_requested():
                self.cancelled = True
                job.pump.mute()
                self.say("the watchdog reported a hang: terminating the job")
                stop_job(job.proc, self.plan.run_id)
            if self.sidecar is not None:
                self.sidecar.keep_alive()
            time.sleep(0.2)

    def cancel_requested(self) -> bool:
        """The sidecar asked to end the job: through the pipe, or (a sidecar restarted from
        another launcher's plan) through the cancel record."""
        try:
            said = os.read(self.cancel_pipe[0], 4096).decode(errors="replace")
        except BlockingIOError:
            said = ""
        for request in HangRequest.heard(said):
            self.cancel_incident = request.incident_id
        return self.cancel_incident is not None or HangRequest.read(self.layout) is not None

    def record_exit(self, returncode: int | None) -> bool:
        """Tell the sidecar how the job ended; False when the run directory refuses."""
        record = {"run_id": self.plan.run_id, "returncode": returncode, "time": time.time()}
        try:
            self.layout.job_exit_dir.mkdir(exist_ok=True)  # never re-create a deleted run dir
            write_json_atomic(self.layout.job_exit(self.node), record)
        except OSError as exc:
            self.say(f"cannot record the job's end in {self.layout.run_dir}: {exc.strerror}")
            return False
        return True

    def exit_code(self, returncode: int | None, interrupted: bool) -> int:
        """Exit 3 only where this launcher ended the job for the watchdog: a job that ended by
        itself first (a crash the sidecar posted while its teardown ran) keeps its own code."""
        if interrupted:
            return ExitCode.INTERRUPTED
        if self.cancelled:
            self.say_verdict()
            return ExitCode.HANG_CANCELLED
        if HangRequest.read(self.layout) is not None:
            self.say_verdict(cancelled=False)
        return ExitCode.OK if returncode == 0 else ExitCode.JOB_FAILED

    def say_verdict(self, cancelled: bool = True) -> None:
        for line in cancel_verdict(self.layout, self.cancel_incident, cancelled):
            self.say(line)


def cancel_verdict(
    layout: RunLayout, incident_id: str | None = None, cancelled: bool = True
) -> list[str]:
    """The last words on the terminal after a cancel (or a report posted as the job ended by
    itself): the verdict and where the report is (a full disk may have kept both off the
    disk: the sidecar said the verdict already)."""
    request = HangRequest.read(layout)
    incident = layout.incidents_dir / str(request.incident_id if request else incident_id)
    report = read_json(incident / "report.json")
    if not isinstance(report, dict):
        return []
    how = (
        "job cancelled after a hang"
        if cancelled
        else "the job ended by itself; the watchdog reported"
    )
    return [
        f"{how}: {report.get('category')} -- {report.get('summary')}",
        f"report: {incident / 'report.md'}",
    ]


class _Piped:
    """A started process whose output goes, masked, to the terminal and to its log file."""

    def __init__(
        self, spec: ProcessSpec, out: TextIO, mask: Mask, env: dict[str, str] | None = None
    ) -> None:
        self.spec = replace(spec, env={**spec.env, **(env or {})}) if env else spec
        self.log = _open_log(spec.log)
        self.proc = start(
            self.spec, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            errors="replace",
        )  # fmt: skip
        self.pump = OutputPump(self.proc.stdout, out, self.log, mask)

    def stop(self, run_id: str, grace: float) -> None:
        """End it and every process of the run (what a job that ended by itself left running:
        AReaL's forked workers live in sessions of their own), then close its log."""
        if self.proc.poll() is None:
            stop_job(self.proc, run_id, grace=grace)
        else:
            kill_run_processes(run_id)
        self.pump.thread.join(timeout=5)
        self.log.close()


def _open_log(path: str | None) -> TextIO:
    """The process's log file for appending (its folder made: AReaL's log folder may not exist
    before the job writes to it); the null device when the plan names none."""
    if path is None:
        return open(os.devnull, "w")  # noqa: SIM115 - closed by _Piped.stop
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return open_append(Path(path))


def _gate_values(
    gate: Gate, services: list[_Piped], interrupts: Interrupts, say: Callable[[str], None]
) -> dict[str, str] | None:
    """Wait at the gate while every service lives and nobody interrupts."""

    def blocked() -> str | None:
        if interrupts.count:
            return "interrupted"
        dead = [p.spec.name for p in services if p.proc.poll() is not None]
        return f"{', '.join(dead)} exited" if dead else None

    return pass_gate(gate, blocked, say)


class _Sidecar:
    """The watchdog process: restarted (a bounded number of times) if it dies mid-job."""

    def __init__(
        self, spec: ProcessSpec, out: TextIO, say: Callable[[str], None], cancel_fd: int
    ) -> None:
        self.spec = replace(spec, env={**spec.env, ENV_CANCEL_FD: str(cancel_fd)})
        self.out, self.say, self.cancel_fd = out, say, cancel_fd
        self.restarts = 0
        self.proc: subprocess.Popen | None = self._start()

    def _start(self) -> subprocess.Popen:
        stdout = self.out if _has_fileno(self.out) else None
        return start(self.spec, stdout=stdout, pass_fds=(self.cancel_fd,))

    def keep_alive(self) -> None:
        if self.proc is None or self.proc.poll() is None:
            return
        code = self.proc.returncode
        if self.restarts >= SIDECAR_RESTARTS:
            self.say(
                f"the watchdog sidecar died again (exit {code}): the job is UNWATCHED from now on"
            )
            self.proc = None
            return
        self.restarts += 1
        self.say(
            f"the watchdog sidecar died (exit {code}): restarting it "
            f"({self.restarts}/{SIDECAR_RESTARTS})"
        )
        self.proc = self._start()

    def finish(self, interrupted: bool, job_ended: float) -> None:
        """Let the sidecar say its last word until ``JOB_END_BUDGET_S`` after ``job_ended``
        (monotonic); then it is stopped: the job's end is never held by the watchdog."""
        if self.proc is None:
            return
        if interrupted:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=max(0.5, job_ended + JOB_END_BUDGET_S - time.monotonic()))
            return
        except subprocess.TimeoutExpired:
            self.say(f"the watchdog sidecar was still busy {JOB_END_BUDGET_S:g} s after the "
                     "job's end: stopping it")  # fmt: skip
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=SIDECAR_STOP_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _has_fileno(stream: TextIO) -> bool:
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    return True
