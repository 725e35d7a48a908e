"""A process that must not outlive its parent asks the kernel for a signal when it dies."""

from __future__ import annotations

import contextlib
import ctypes
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """``sig`` to this process when its parent (the thread that started it) dies, whatever the
    reason (``kill -9``, a closed terminal, the end of a Slurm task). Called in a child before
    exec, or by the process."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
