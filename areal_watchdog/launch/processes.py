"""The processes of a local launch: started so that none outlives the launcher, watched, and
stopped in order (SIGCONT for stopped ranks, SIGTERM, a grace period, then SIGKILL).

Every child gets ``PR_SET_PDEATHSIG``: if the launcher dies (``kill -9``, a closed terminal),
the kernel sends it SIGTERM, torchrun stops its ranks and the sidecar ends; nothing of the run
keeps going unsupervised.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from typing import Any, TextIO

import psutil

from areal_watchdog.common.interprocess.parent import die_with_parent
from areal_watchdog.common.secrets.mask import Mask
from areal_watchdog.evidence.kernel_readings.kernel_wait import main_wait
from areal_watchdog.launch.planning.plan import ProcessSpec
from areal_watchdog.rundir.run_processes import kill_run_processes, run_processes

TERMINATE_GRACE = 20.0  # seconds torchrun gets to stop its ranks before everything is killed


def start(spec: ProcessSpec, **popen: Any) -> subprocess.Popen:
    """Start one planned process in a session of its own, tied to the launcher's life."""
    return subprocess.Popen(
        spec.argv,
        env={**os.environ, **spec.env},
        cwd=spec.cwd,
        start_new_session=True,
        preexec_fn=die_with_parent,  # noqa: PLW1509 - no threads run code between fork and exec
        **popen,
    )


def stop_job(job: subprocess.Popen, run_id: str, grace: float = TERMINATE_GRACE) -> None:
    """SIGTERM torchrun (it stops its ranks); after ``grace`` kill whatever is left.

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
        _wait_unless_in_kernel(job, run_id, grace)
    except subprocess.TimeoutExpired:
        job.kill()
        job.wait()
    kill_run_processes(run_id)


IN_KERNEL_GRACE = 2.0  # seconds for ranks in D: a SIGTERM they handle waits on their storage


def _wait_unless_in_kernel(job: subprocess.Popen, run_id: str, grace: float) -> None:
    """Wait up to ``grace`` for the job to end; where a process of the run is blocked in the
    kernel (a read from storage that stopped answering) at two checks a second apart after
    ``IN_KERNEL_GRACE``, kill the run at once: a rank that handles SIGTERM does so only once
    its wait ends, and a killable wait (NFS's) ends at a SIGKILL. A job that ends in time is
    never checked."""
    deadline = time.monotonic() + grace
    with contextlib.suppress(subprocess.TimeoutExpired):
        job.wait(timeout=min(grace, IN_KERNEL_GRACE))
        return
    before: set[int] = set()
    while time.monotonic() < deadline:
        blocked = blocked_in_kernel(run_id)
        if blocked & before:
            kill_run_processes(run_id)
            job.wait(timeout=max(0.1, deadline - time.monotonic()))
            return
        before = blocked
        with contextlib.suppress(subprocess.TimeoutExpired):
            job.wait(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            return
    raise subprocess.TimeoutExpired(job.args, grace)


def blocked_in_kernel(run_id: str) -> set[int]:
    """The processes of the run blocked in the kernel now: in D, or asleep in a file
    operation (a FUSE reader)."""
    found = set()
    for proc in run_processes(run_id):
        wait = main_wait(proc.pid)
        if wait is not None and wait.stuck:
            found.add(proc.pid)
    return found


class OutputPump:
    """Copies the job's output, each line masked (``common.secrets.mask``), to the terminal and to a
    log; ``mute`` keeps only the log (after a cancel, torchrun's own traceback about the signal
    is noise on the terminal)."""

    def __init__(self, source: TextIO, out: TextIO, log: TextIO, mask: Mask) -> None:
        self.muted = False
        self.mask = mask
        self.thread = threading.Thread(target=self._run, args=(source, out, log), daemon=True)
        self.thread.start()

    def mute(self) -> None:
        self.muted = True

    def _run(self, source: TextIO, out: TextIO, log: TextIO) -> None:
        for raw in source:
            line = self.mask(raw)
            if not self.muted:
                out.write(line)
                out.flush()
            log.write(line)
            log.flush()


class Interrupts:
    """Turns SIGINT, SIGTERM and SIGHUP into a count, so the launcher stops its children in
    order; a second one means "now": the caller kills instead of waiting."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.count = 0
        self.previous: dict[int, Any] = {}
        self.on_second: Any = None
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self.previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.count += 1
        if self.count >= 2 and self.on_second is not None:
            self.on_second()

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
