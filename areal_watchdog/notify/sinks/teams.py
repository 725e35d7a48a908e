"""Microsoft Teams: an Adaptive Card (1.4) to an incoming webhook or a Workflows (Power
Automate) URL. The vendor's rules: a message of at most 28 KB; a Workflows URL answers 202, an
incoming webhook 200 with ``1``, and a connector that could not deliver says so in a 200's
text."""

from __future__ import annotations

from typing import Any

from areal_watchdog.notify.digest import clip, facts, fit, group_lines, headline, report_path
from areal_watchdog.notify.envelope import is_warning
from areal_watchdog.notify.sinks.base import Answer, Keys, Sink

MAX_BODY_BYTES = 28 * 1024
CARD = "application/vnd.microsoft.card.adaptive"
SCHEMA = "http://adaptivecards.io/schemas/adaptive-card.json"


class TeamsSink(Sink):
    type = "teams"
    keys = Keys(
        {"url": "the channel's incoming webhook or Workflows URL"},
        (("url",),),
    )

    def report(self, report: dict[str, Any]) -> dict[str, Any]:
        return fit(lambda report, shown: _message(_body(report, shown)), report, MAX_BODY_BYTES)

    def note(self, text: str, thread: dict[str, str] | None) -> dict[str, Any]:
        return _message([{"type": "TextBlock", "text": text, "wrap": True}])

    def answer(self, text: str) -> Answer:
        if "delivery failed" not in text.lower():
            return Answer(True)
        return Answer(False, f"Teams: {text.strip()[:200]}", retryable="429" in text)


def _message(body: list[dict[str, Any]]) -> dict[str, Any]:
    card = {"$schema": SCHEMA, "type": "AdaptiveCard", "version": "1.4",
            "msteams": {"width": "Full"}, "body": body}  # fmt: skip
    attachment = {"contentType": CARD, "contentUrl": None, "content": card}
    return {"type": "message", "attachments": [attachment]}


def _body(report: dict[str, Any], shown: int) -> list[dict[str, Any]]:
    color = "Warning" if is_warning(report) else "Attention"
    stacks = [
        {"type": "TextBlock", "text": line, "wrap": True, "fontType": "Monospace",
         "size": "Small"}
        for line in group_lines(report, shown)
    ]  # fmt: skip
    return [
        {"type": "TextBlock", "text": clip(headline(report), 200), "weight": "Bolder",
         "size": "Large", "color": color, "wrap": True},
        {"type": "TextBlock", "text": clip(report["summary"], 2000), "wrap": True},
        {"type": "FactSet", "facts": [{"title": k, "value": v} for k, v in facts(report)]},
        *stacks,
        {"type": "TextBlock", "text": f"Full report: {report_path(report)}", "isSubtle": True,
         "wrap": True},
    ]  # fmt: skip
