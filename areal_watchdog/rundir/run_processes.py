"""The processes of one run, wherever they were started from: every process of ours that
carries the run id in its environment (ranks, their workers, AReaL's workers and the servers
they start, a tool an episode runs). The launcher ends them at the end of a run; a sidecar whose
launcher died ends them too, so that nothing of the run keeps going unsupervised."""

from __future__ import annotations

import contextlib
import os

import psutil

from areal_watchdog.rundir.layout import ENV_RUN_ID


def run_processes(run_id: str) -> list[psutil.Process]:
    """Every process of ours that carries this run id: ranks, their workers, servers they
    started. Another user's process is never one of them, whatever its environment says."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or proc.uids().real != os.getuid():
                continue
            if proc.environ().get(ENV_RUN_ID) == run_id:
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
