"""Waiting for a file another process writes, without polling the shared filesystem a hundred
times a second: looks that grow sparser."""

from __future__ import annotations

import time
from collections.abc import Iterator

FIRST_LOOK = 0.05  # seconds before the first look
LONGEST_PAUSE = 0.25  # seconds between two looks, at most


def looks(timeout: float) -> Iterator[None]:
    """Yield once a look until ``timeout`` seconds passed (the last look at the deadline), the
    pauses before looks doubling from ``FIRST_LOOK`` to ``LONGEST_PAUSE``: an answer that comes
    at once is seen 50 ms later (a look at once found nothing, and at 10 ms the ranks of 64
    sidecars on two cores were looked at twice each on average: a wasted lookup per rank on the
    shared filesystem), one that never comes (a stopped rank) costs a few looks a second."""
    deadline = time.monotonic() + timeout
    pause = FIRST_LOOK
    while time.monotonic() < deadline:
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        yield
        pause = min(LONGEST_PAUSE, pause * 2)
