"""A node's status kept moving while its sidecar is busy in one long step.

A leader that gathers stacks with py-spy or builds a report can spend longer than
``node_timeout`` in one poll, and a follower answering with its own stacks can too; their peers
then took them for lost (seen in CI: a leader 7 s in a report under load, ``node_timeout: 3``,
reported lost by its follower). A thread writes the last status again when it is due and the
loop has been in one step for half a status period (a step that short publishes itself), so
long as that step began within ``WEDGED_AFTER`` seconds: a loop stuck longer is wedged, and its
node is let fall silent and be named.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from areal_watchdog.watch.cluster.coordination import Coordinator

WEDGED_AFTER = 300.0  # seconds in one step after which a sidecar's loop counts as wedged
SOONEST = 0.05  # seconds between two looks at whether the status is due, at least


class StatusKeeper:
    """Keeps ``coordinator``'s status alive from a thread of its own while the loop is busy."""

    def __init__(self, coordinator: Coordinator, wedged_after: float = WEDGED_AFTER) -> None:
        self.coordinator = coordinator
        self.wedged_after = wedged_after
        self.step_began: float | None = None  # when the loop's current step began, in one
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-keeper", daemon=True)

    def __enter__(self) -> StatusKeeper:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """The loop's step (a poll, the job's end): while it lasts, the status is kept alive."""
        self.step_began = time.monotonic()
        try:
            yield
        finally:
            self.step_began = None

    def _run(self) -> None:
        while not self._stop.wait(self._until_due()):
            began = self.step_began
            if began is None:
                continue
            busy_for = time.monotonic() - began
            if self.coordinator.interval / 2 <= busy_for <= self.wedged_after:
                with contextlib.suppress(OSError):  # a full disk: one status missed
                    self.coordinator.keep_alive()

    def _until_due(self) -> float:
        due_at = self.coordinator.published_at + self.coordinator.interval
        return max(SOONEST, due_at - time.monotonic())
