"""One execution of a Ray plan: the cluster (ours, if the plan starts one), the job through
the Jobs API, its driver's and sidecars' lines on the terminal, and how the run ends.

The sidecars run on the cluster's nodes, not under this process: they watch its heartbeat
(``launcher.json``) and end everything of the run if it stops (``kill -9``, a closed terminal).
A sidecar's cancel is its record (``cancelled.json``): this process stops the Ray job.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shlex
import threading
import time
from pathlib import Path
from typing import TextIO

from areal_watchdog.common.atomic import write_json_atomic
from areal_watchdog.launch.exit_codes import ExitCode
from areal_watchdog.launch.local import JOB_END_BUDGET_S, cancel_verdict
from areal_watchdog.launch.planning.job import prepare_run_dir
from areal_watchdog.launch.planning.plan import LaunchPlan
from areal_watchdog.launch.processes import Interrupts
from areal_watchdog.launch.ray.guardian import start_guardian
from areal_watchdog.launch.ray.jobs import (
    CONNECT_PATIENCE_S,
    ENDED,
    SUBMIT_PATIENCE_S,
    RayJobs,
    job_returncode,
)
from areal_watchdog.launch.ray.submission import RaySubmission
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.run_id_check import read_run_record
from areal_watchdog.rundir.sidecar_files.hang_request import HangRequest

HEARTBEAT_S = 1.0
POLL_S = 0.5


class RayRun:
    """One Ray launch, from the cluster's start to the sidecars' last word."""

    def __init__(self, plan: LaunchPlan, out: TextIO) -> None:
        self.plan, self.out = plan, out
        self.sub: RaySubmission = plan.payload
        self.layout = RunLayout(Path(plan.run_dir))
        self.tails = LogTails(self.layout, out)
        self.beating = threading.Event()
        self.cancelled = False

    def say(self, message: str) -> None:
        print(f"[areal-launch] {message}", file=self.out, flush=True)

    def run(self) -> int:
        held = prepare_run_dir(self.plan, lock=True)
        self.say(f"run {self.plan.run_id}: {self.plan.run_dir}")
        interrupts = Interrupts()
        self.start_heartbeat()
        state, returncode = "NOT STARTED", 1
        raylets = None
        guardian = start_guardian(self.layout, self.plan.run_id)
        try:
            if self.sub.cluster:
                raylets = self.sub.cluster.start(self.sub.python, self.layout.logs_dir, self.say)
                groups = {"run_id": self.plan.run_id, "groups": raylets.groups}
                write_json_atomic(self.layout.ray_cluster_file, groups)
            jobs = RayJobs(self.sub.address, patience=CONNECT_PATIENCE_S)
            job = self.plan.main()
            entrypoint = f"cd {shlex.quote(job.cwd or os.getcwd())} && {shlex.join(job.argv)}"
            jobs.submit(entrypoint, self.sub.submission_id, job.env, SUBMIT_PATIENCE_S)
            self.say(f"Ray job {self.sub.submission_id} submitted to {self.sub.address}")
            state = self.follow(jobs, interrupts)
            returncode = job_returncode(state, jobs.info(self.sub.submission_id))
            self.record_exits(returncode)
            self.wait_for_sidecars()
        finally:
            interrupts.restore()
            self.stop_heartbeat()
            if raylets is not None:
                raylets.stop()
            guardian.stdin.close()  # type: ignore[union-attr] - it ends what is left, and exits
            guardian.wait(timeout=30)
            self.tails.pump()
            if held is not None:
                os.close(held)
        return self.exit_code(state, returncode, interrupts.count > 0)

    def follow(self, jobs: RayJobs, interrupts: Interrupts) -> str:
        """Until the job ends: its lines on the terminal, a cancel or an interrupt acted on."""
        stopped = False
        while True:
            self.tails.pump()
            state = jobs.status(self.sub.submission_id)
            if state in ENDED:
                return state
            if not stopped and interrupts.count:
                stopped = self.tails.muted = True
                self.say("interrupted: stopping the Ray job")
                record = {"run_id": self.plan.run_id, "time": time.time()}
                with contextlib.suppress(OSError):
                    write_json_atomic(self.layout.interrupted_file, record)
                jobs.stop(self.sub.submission_id)
            if not stopped and HangRequest.read(self.layout) is not None:
                stopped = self.cancelled = self.tails.muted = True
                self.say("the watchdog reported a hang: stopping the Ray job")
                jobs.stop(self.sub.submission_id)
            time.sleep(POLL_S)

    def record_exits(self, returncode: int) -> None:
        """The driver records the job's end on every node; a driver that was stopped cannot."""
        info = LaunchInfo.load(self.layout.run_dir)
        record = {"run_id": self.plan.run_id, "returncode": returncode, "time": time.time()}
        with contextlib.suppress(OSError):
            self.layout.job_exit_dir.mkdir(exist_ok=True)
        for node in info.nodes:
            if read_run_record(self.layout.job_exit(node), self.plan.run_id) is None:
                with contextlib.suppress(OSError):
                    write_json_atomic(self.layout.job_exit(node), record)

    def wait_for_sidecars(self) -> None:
        """The sidecars' last word (``finished.json``), for a while."""
        if not self.plan.of_kind("watchdog"):
            return
        deadline = time.monotonic() + JOB_END_BUDGET_S
        while time.monotonic() < deadline:
            self.tails.pump()
            if read_run_record(self.layout.finished_file, self.plan.run_id) is not None:
                time.sleep(POLL_S)  # its last lines
                return
            time.sleep(POLL_S)
        self.say("the sidecars did not finish in time")

    def exit_code(self, state: str, returncode: int, interrupted: bool) -> int:
        if interrupted:
            return ExitCode.INTERRUPTED
        if self.cancelled or HangRequest.read(self.layout) is not None:
            for line in cancel_verdict(self.layout):
                self.say(line)
            return ExitCode.HANG_CANCELLED
        if state != "SUCCEEDED":
            self.say(f"the Ray job ended {state} (driver exit {returncode})")
        return ExitCode.OK if state == "SUCCEEDED" and returncode == 0 else ExitCode.JOB_FAILED

    # -------------------------------------------------------------- heartbeat
    def start_heartbeat(self) -> None:
        self.beating.set()
        threading.Thread(target=self._beat, daemon=True).start()

    def _beat(self) -> None:
        while self.beating.is_set():
            self._write_heartbeat(ended=False)
            time.sleep(HEARTBEAT_S)

    def stop_heartbeat(self) -> None:
        self.beating.clear()
        self._write_heartbeat(ended=True)

    def _write_heartbeat(self, ended: bool) -> None:
        record = {"run_id": self.plan.run_id, "time": time.time(), "pid": os.getpid(),
                  "ended": ended}  # fmt: skip
        with contextlib.suppress(OSError):
            write_json_atomic(self.layout.launcher_file, record)


class LogTails:
    """The driver's output and every sidecar's, line by line, on the terminal."""

    def __init__(self, layout: RunLayout, out: TextIO) -> None:
        self.driver_log = str(layout.ray_driver_log)
        self.patterns = [self.driver_log, str(layout.logs_dir / "sidecar_*.out")]
        self.out = out
        self.offsets: dict[str, int] = {}
        self.muted = False  # the driver's dying words after our stop are noise (still in its log)

    def pump(self) -> None:
        for path in sorted(p for pattern in self.patterns for p in glob.glob(pattern)):
            offset = self.offsets.get(path, 0)
            try:
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    data = fh.read()
            except OSError:
                continue
            complete = data[: data.rfind(b"\n") + 1]
            self.offsets[path] = offset + len(complete)
            if complete and not (self.muted and path == self.driver_log):
                with contextlib.suppress(OSError, ValueError):
                    self.out.write(complete.decode(errors="replace"))
                    self.out.flush()
