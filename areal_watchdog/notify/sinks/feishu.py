"""Feishu (Lark) custom bot, signed: an interactive card with the verdict, the culprits, the
stacks that fit and the report's path. The vendor's rules: a request body of at most 20 KB;
``timestamp`` (seconds) and ``sign`` in the body, within an hour of Feishu's clock; an answer
``{"code": 0}`` (HTTP 200 carries refusals too: 19021 a bad signature, 11232 too fast)."""

from __future__ import annotations

import json
from typing import Any

from areal_watchdog.notify.digest import clip, facts, fit, group_lines, headline, report_path
from areal_watchdog.notify.envelope import encode, is_warning
from areal_watchdog.notify.sinks.base import Answer, Keys, Request, Sink, coded_answer
from areal_watchdog.notify.sinks.signing import feishu_sign

MAX_BODY_BYTES = 20 * 1024
RATE_LIMITED = 11232
SIGN_ROOM = 120  # bytes the per-attempt timestamp and sign add to the body


class FeishuSink(Sink):
    type = "feishu"
    keys = Keys(
        {"url": "the bot's webhook URL (open.feishu.cn or open.larksuite.com)",
         "secret": "the bot's signing secret (its security settings: signature)"},
        (("url",), ("secret",)),
    )  # fmt: skip
    pace = 0.6  # 100 messages a minute per bot

    def report(self, report: dict[str, Any]) -> dict[str, Any]:
        return fit(_card, report, MAX_BODY_BYTES - SIGN_ROOM)

    def note(self, text: str, thread: dict[str, str] | None) -> dict[str, Any]:
        return {"msg_type": "text", "content": {"text": text}}

    def request(self, values: dict[str, str], body: bytes, message_id: str, now: float) -> Request:
        timestamp = int(now)
        signed = {**json.loads(body), "timestamp": str(timestamp),
                  "sign": feishu_sign(values["secret"], timestamp)}  # fmt: skip
        return Request(values["url"], encode(signed))

    def answer(self, text: str) -> Answer:
        return coded_answer(text, "Feishu", ("code", "StatusCode"), ("msg", "StatusMessage"),
                            RATE_LIMITED)  # fmt: skip


def _card(report: dict[str, Any], shown: int) -> dict[str, Any]:
    fields = [
        {"is_short": True, "text": {"tag": "lark_md", "content": clip(f"**{k}**\n{v}", 500)}}
        for k, v in facts(report)
    ]
    stacks = "\n".join(group_lines(report, shown)) or "no stack groups"
    elements = [
        {"tag": "div", "text": {"tag": "plain_text", "content": clip(report["summary"], 2000)}},
        {"tag": "div", "fields": fields},
        {"tag": "hr"},
        {"tag": "div", "text": {"tag": "plain_text", "content": stacks}},
        {"tag": "note", "elements": [
            {"tag": "plain_text", "content": f"Full report: {report_path(report)}"}]},
    ]  # fmt: skip
    header = {
        "template": "orange" if is_warning(report) else "red",
        "title": {"tag": "plain_text", "content": clip(headline(report), 100)},
    }
    return {"msg_type": "interactive",
            "card": {"config": {"wide_screen_mode": True}, "header": header,
                     "elements": elements}}  # fmt: skip
