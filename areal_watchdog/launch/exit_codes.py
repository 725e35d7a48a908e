"""The exit codes of ``areal-launch`` (docs/cli.md): scripts and CI branch on them."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """How a launch ended."""

    OK = 0
    JOB_FAILED = 1
    USAGE = 2
    HANG_CANCELLED = 3  # a hang was detected and the job cancelled (watchdog.on_hang: cancel)
    CANCELLED = 4  # cancelled by someone else (slurm --wait)
    TIMEOUT = 5  # Slurm's time limit (slurm --wait)
    INTERRUPTED = 130  # Ctrl-C, SIGTERM or SIGHUP to the launcher
