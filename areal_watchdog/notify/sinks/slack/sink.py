"""Slack: an incoming webhook, or a bot token posting with ``chat.postMessage`` (then every
follow-up, the timeline's picture included, replies in the incident's thread)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from areal_watchdog.common.secrets.redact import Redactor
from areal_watchdog.config.sinks import ResolvedSink
from areal_watchdog.notify.sinks.base import Answer, Keys, Option, Request, Sink
from areal_watchdog.notify.sinks.slack.message import build_slack_message
from areal_watchdog.notify.sinks.slack.upload import upload_picture

SLACK_API = "https://slack.com/api/chat.postMessage"  # where a bot token posts (and threads)


class SlackSink(Sink):
    type = "slack"
    keys = Keys(
        {"webhook_url": "an incoming webhook's URL", "token": "a bot token (xoxb-...)"},
        (("webhook_url", "token"),),
        {
            "channel": Option(None, "with a token: the channel it posts to (C0123)"),
            "api_url": Option(SLACK_API, "with a token: Slack's chat.postMessage"),
        },
    )
    pace = 1.1  # Slack: about one message a second per webhook

    @property
    def threads(self) -> bool:
        return "token" in self.spec.sources

    def problem(self) -> tuple[str, str] | None:
        if self.threads and "webhook_url" in self.spec.sources:
            return "token_env", "give a token or a webhook_url, not both"
        if self.threads and not self.option("channel"):
            return "channel", "is missing: a bot token posts to a channel (C0123)"
        return None

    def endpoint(self, values: dict[str, str]) -> str:
        return self.option("api_url") if "token" in values else values["webhook_url"]

    def report(self, report: dict[str, Any]) -> dict[str, Any]:
        message = build_slack_message(report)
        channel = self.option("channel")
        return {**message, "channel": channel} if channel else message

    def note(self, text: str, thread: dict[str, str] | None) -> dict[str, Any]:
        message: dict[str, Any] = {"text": text}
        if self.option("channel"):
            message["channel"] = (thread or {}).get("channel") or self.option("channel")
        if thread:
            message["thread_ts"] = thread["ts"]
        return message

    def upload(
        self, sink: ResolvedSink, thread: dict[str, str], png: Path, title: str, redactor: Redactor
    ) -> str:
        return upload_picture(sink, self.option("api_url"), thread, png, title, redactor)

    def request(self, values: dict[str, str], body: bytes, message_id: str, now: float) -> Request:
        headers = {"Authorization": f"Bearer {values['token']}"} if "token" in values else {}
        return Request(self.endpoint(values), body, headers)

    def answer(self, text: str) -> Answer:
        """Slack's Web API answers 200 to a refusal too: the post's channel and ts, or why."""
        if not self.threads:
            return Answer(True)
        try:
            answer = json.loads(text)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            return Answer(False, "Slack API: the answer is not JSON", retryable=False)
        if answer.get("ok") is True and isinstance(answer.get("ts"), str):
            return Answer(True, thread={"channel": str(answer.get("channel") or ""),
                                        "ts": answer["ts"]})  # fmt: skip
        error = str(answer.get("error") or "not ok")
        return Answer(False, f"Slack API: {error[:200]}", retryable=error == "ratelimited")
