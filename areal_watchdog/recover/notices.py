"""What the sinks hear after ``on_hang: resume`` decided about a hang: one message per decision,
under the incident's id. A webhook gets a ``hang.recovery`` event; Slack a short follow-up that
names the incident, in the incident's thread when the sink posts with a bot token (the ledger
keeps the first post's ts); an incoming webhook cannot reply in a thread.

Sent by the launcher, which decided; delivered, spooled and deduplicated as reports are.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from areal_watchdog.common.redact import Redactor
from areal_watchdog.config.sinks import SinkSpec
from areal_watchdog.notify.delivery import deliver, delivery_id
from areal_watchdog.notify.envelope import ENVELOPE_SCHEMA, encode
from areal_watchdog.notify.notifier import resolve_all, secret_values
from areal_watchdog.notify.spool import Spool
from areal_watchdog.report.build import iso

EVENT = "hang.recovery"


def recovery_envelope(report: dict[str, Any], recovery: dict[str, Any]) -> dict[str, Any]:
    """The webhook event: the incident's id and job, and the report's ``recovery`` section."""
    return {
        "schema": ENVELOPE_SCHEMA,
        "event_type": EVENT,
        "incident_id": report["incident_id"],
        "time": iso(time.time()),
        "job": report["job"],
        "recovery": recovery,
    }


def recovery_slack(
    report: dict[str, Any], recovery: dict[str, Any], spec: SinkSpec, thread: dict | None
) -> dict[str, Any]:
    """The Slack follow-up: what was decided, for the incident posted before (a reply in its
    thread when there is one)."""
    job = report["job"]
    name = f"{job.get('experiment_name') or '?'}/{job.get('trial_name') or '?'}"
    verb = "resumed" if recovery["decision"] == "resume" else "not resumed"
    message: dict[str, Any] = {
        "text": f"[areal-watchdog] {name} {verb} after incident {report['incident_id']}: "
        f"{recovery['reason']}"
    }
    if spec.channel:
        message["channel"] = (thread or {}).get("channel") or spec.channel
    if thread:
        message["thread_ts"] = thread["ts"]
    return message


def send_recovery(
    specs: list[SinkSpec],
    spool_dir: Path,
    report: dict[str, Any],
    recovery: dict[str, Any],
    log: Callable[[str], None],
) -> None:
    """Tell every sink what was decided (scrubbed; what fails stays in the run's spool)."""
    redactor = Redactor.from_environment().with_values(secret_values(specs))
    spool = Spool(spool_dir, warn=log)
    key = f"{report['incident_id']}|recovery{recovery['attempt']}"
    for sink in resolve_all(specs, log):
        if sink.spec.type == "slack":
            first = delivery_id(report["incident_id"], sink.spec)
            thread = spool.thread_of(first) if sink.spec.threads else None
            message = recovery_slack(report, recovery, sink.spec, thread)
        else:
            message = recovery_envelope(report, recovery)
        body = encode(redactor.scrub_tree(message))
        outcome = deliver(sink, body, delivery_id(key, sink.spec), redactor, spool)
        log(f"recovery notice to {sink.spec.name}: {outcome.describe()}")
