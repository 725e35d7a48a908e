"""Messages after a report, under its incident: what a resume decided, that the incident is
over. Each sink says what it makes of one (``Sink.recovery``, ``Sink.resolution``; None: it
takes none), in the incident's thread where the sink threads. Delivered, spooled and
deduplicated as reports are: each follow-up has its own delivery id."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from areal_watchdog.common.secrets.redact import Redactor
from areal_watchdog.config.sinks import SinkSpec, secret_values
from areal_watchdog.notify.delivery import deliver, delivery_id
from areal_watchdog.notify.envelope import encode
from areal_watchdog.notify.sinks.base import Sink
from areal_watchdog.notify.sinks.registry import installed
from areal_watchdog.notify.spool import Spool

# (the sink, the incident's thread there or None) -> the message, or None for none
Make = Callable[[Sink, dict[str, str] | None], dict[str, Any] | None]


def send_follow_up(
    specs: list[SinkSpec],
    spool_dir: Path,
    incident_id: str,
    key: str,
    make: Make,
    log: Callable[[str], None],
    label: str,
    send: bool = True,
) -> int:
    """Send one follow-up of ``incident_id`` (``key`` names which, ``label`` in words) to
    every sink that takes it, once; return how many were delivered (what fails stays in the
    spool). Not ``send``: only spool it, for a later flush."""
    redactor = Redactor.from_environment().with_values(secret_values(specs))
    spool = Spool(spool_dir, warn=log)
    done = spool.delivered_ids()
    delivered = 0
    for kind, sink in installed(specs, log):
        message_id = delivery_id(f"{incident_id}|{key}", sink.spec)
        if message_id in done:
            continue
        thread = spool.thread_of(delivery_id(incident_id, sink.spec)) if kind.threads else None
        message = make(kind, thread)
        if message is None:
            continue
        body = encode(redactor.scrub_tree(message))
        if not send:
            spool.keep(message_id, sink.spec, body, "not sent yet")
            continue
        outcome = deliver(sink, body, message_id, redactor, spool)
        log(f"{label} notice to {sink.spec.name}: {outcome.describe()}")
        delivered += outcome.delivered
    return delivered
