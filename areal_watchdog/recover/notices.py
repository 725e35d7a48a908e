"""What the sinks hear after ``on_hang: resume`` decided about a hang: one message per
decision, under the incident's id (``Sink.recovery``: a webhook gets a ``hang.recovery`` event,
a chat a short line naming the incident, in its thread where the sink threads). Sent by the
launcher, which decided."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from areal_watchdog.config.sinks import SinkSpec
from areal_watchdog.notify.follow_ups import send_follow_up


def send_recovery(
    specs: list[SinkSpec],
    spool_dir: Path,
    report: dict[str, Any],
    recovery: dict[str, Any],
    log: Callable[[str], None],
) -> None:
    """Tell every sink what was decided (scrubbed; what fails stays in the run's spool)."""
    send_follow_up(
        specs, spool_dir, report["incident_id"], f"recovery{recovery['attempt']}",
        lambda sink, thread: sink.recovery(report, recovery, thread), log, "recovery",
    )  # fmt: skip
