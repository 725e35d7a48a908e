"""A seventh sink in one file: ntfy (https://ntfy.sh), a push to phones, published as JSON."""

from __future__ import annotations

from typing import Any

from areal_watchdog.notify.digest import culprits, headline, report_path
from areal_watchdog.notify.sinks.base import Keys, Option, Request, Sink


class NtfySink(Sink):
    """Spool, retries, delivery ids and redaction are the common ones; only the message and
    the request are ntfy's."""

    type = "ntfy"
    keys = Keys(
        {"url": "the ntfy server (https://ntfy.sh)", "token": "an access token (tk_...)"},
        (("url",),),
        {"topic": Option("areal-hangs", "the topic the phones subscribe to")},
    )

    def report(self, report: dict[str, Any]) -> dict[str, Any]:
        return {
            "topic": self.option("topic"),
            "title": headline(report),
            "message": f"{report['summary']}\n{culprits(report)}\n{report_path(report)}",
            "priority": 5,
            "tags": ["rotating_light"],
        }

    def request(self, values: dict[str, str], body: bytes, message_id: str, now: float) -> Request:
        token = values.get("token")
        return Request(values["url"], body, {"Authorization": f"Bearer {token}"} if token else {})
