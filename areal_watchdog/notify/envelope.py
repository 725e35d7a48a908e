"""The generic webhook's envelope (a versioned JSON document) and its HMAC-SHA256 signature.

Headers on every request (``docs/notifications.md``):

- ``webhook-id``: the delivery id, the same on every retry (deduplicate on it);
- ``webhook-timestamp``: Unix seconds of this attempt;
- ``webhook-signature``: ``v1,<base64 HMAC-SHA256(secret, "{id}.{timestamp}.{body}")>``
  (the Standard Webhooks scheme);
- ``X-Hub-Signature-256``: ``sha256=<hex HMAC-SHA256(secret, body)>`` (GitHub's scheme).

A secret given as ``whsec_<base64>`` is base64-decoded first (Standard Webhooks); any other
secret is used as its UTF-8 bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

from areal_watchdog.config.sinks import secret_key
from areal_watchdog.diagnose.kinds import kind_of

ENVELOPE_SCHEMA = "areal-watchdog.incident.v1"


def is_warning(report: dict[str, Any]) -> bool:
    """Posted while the job goes on (``confirmation.warning``), not a hang: damage, or a
    silence that moves without working (a possible livelock, a retry loop)."""
    return bool((report.get("confirmation") or {}).get("warning"))


def is_damage(report: dict[str, Any]) -> bool:
    """A warning of damage (rewards silently scored 0): it lasts until the job ends, where a
    silence's warning ends with the next step."""
    confirmation = report.get("confirmation") or {}
    return is_warning(report) and not (
        confirmation.get("livelock") or confirmation.get("retry_loop")
    )


def build_envelope(report: dict[str, Any]) -> dict[str, Any]:
    """The stable subset of a report that receivers consume."""
    event = "job.failed" if kind_of(report["category"]).failure else "hang.detected"
    event = "job.warning" if is_warning(report) else event
    trajectory = report.get("trajectory") or {}
    return {
        "schema": ENVELOPE_SCHEMA,
        "event_type": event,
        "incident_id": report["incident_id"],
        "time": report["detected_at"],
        "job": report["job"],
        "verdict": {
            "category": report["category"],
            "confidence": report["confidence"],
            "culprit_ranks": report["culprit_ranks"],
            "culprit_nodes": report["culprit_nodes"],
            "summary": report["summary"],
            "last_step": report["last_step"],
            "stalled_for_s": report.get("stalled_for_s"),
        },
        "groups": [
            {"ranks": g["ranks"], "kind": g["kind"], "where": g["where"]} for g in report["groups"]
        ],
        "ranks": [
            {
                "rank": r["rank"],
                "node": r["node"],
                "state": r["state"],
                "where": r["where"],
                "exit_code": r.get("exit_code"),
            }
            for r in report["ranks"]
        ],
        "report_path": report["files"]["incident_dir"],
        "replay_command": trajectory.get("replay_command"),
    }


def encode(document: dict[str, Any]) -> bytes:
    """The exact bytes that are sent and signed."""
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode("utf-8")


def signature_headers(body: bytes, secret: str, delivery_id: str, timestamp: int) -> dict[str, str]:
    """Both signature headers for one attempt."""
    key = secret_key(secret)
    signed = f"{delivery_id}.{timestamp}.".encode() + body
    standard = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    github = hmac.new(key, body, hashlib.sha256).hexdigest()
    return {
        "webhook-signature": f"v1,{standard}",
        "X-Hub-Signature-256": f"sha256={github}",
    }


def verify(
    body: bytes,
    headers: dict[str, str],
    secret: str,
    tolerance_s: int = 300,
    now: int | None = None,
) -> bool:
    """Check a request as a receiver would: Standard Webhooks signature and timestamp window."""
    lowered = {k.lower(): v for k, v in headers.items()}
    try:
        delivery_id = lowered["webhook-id"]
        timestamp = int(lowered["webhook-timestamp"])
        offered = lowered["webhook-signature"]
    except (KeyError, ValueError):
        return False
    if abs((now if now is not None else int(time.time())) - timestamp) > tolerance_s:
        return False
    expected = signature_headers(body, secret, delivery_id, timestamp)["webhook-signature"]
    return any(hmac.compare_digest(expected, candidate) for candidate in offered.split())
