"""A generic signed webhook: a versioned JSON envelope (``notify/envelope.py``), signed per
attempt with HMAC-SHA256 in the Standard Webhooks and GitHub schemes."""

from __future__ import annotations

import time
from typing import Any

from areal_watchdog.notify.envelope import ENVELOPE_SCHEMA, build_envelope, signature_headers
from areal_watchdog.notify.sinks.base import Keys, Request, Sink
from areal_watchdog.report.build import iso

RECOVERY_EVENT = "hang.recovery"


class WebhookSink(Sink):
    type = "webhook"
    keys = Keys(
        {"url": "the receiver's URL", "secret": "the signing secret (text, or whsec_<base64>)"},
        (("url",),),
    )

    def report(self, report: dict[str, Any]) -> dict[str, Any]:
        return build_envelope(report)

    def recovery(
        self, report: dict[str, Any], recovery: dict[str, Any], thread: dict[str, str] | None
    ) -> dict[str, Any]:
        """The incident's id and job, and the report's ``recovery`` section."""
        return {
            "schema": ENVELOPE_SCHEMA,
            "event_type": RECOVERY_EVENT,
            "incident_id": report["incident_id"],
            "time": iso(time.time()),
            "job": report["job"],
            "recovery": recovery,
        }

    def request(self, values: dict[str, str], body: bytes, message_id: str, now: float) -> Request:
        timestamp = int(now)
        headers = {"webhook-timestamp": str(timestamp)}
        if values.get("secret"):
            headers.update(signature_headers(body, values["secret"], message_id, timestamp))
        return Request(values["url"], body, headers)
