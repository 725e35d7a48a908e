"""DingTalk custom robot, signed: a markdown message. The vendor's rules: ``timestamp``
(milliseconds) and ``sign`` in the URL's query, within an hour of DingTalk's clock; 20 messages a
minute per robot; an answer ``{"errcode": 0}`` (HTTP 200 carries refusals too: 310000 a bad
signature, 130101 too fast). Messages are kept under 20,000 bytes."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote_plus

from areal_watchdog.notify.digest import clip, facts, fit, group_lines, headline, report_path
from areal_watchdog.notify.sinks.base import Answer, Keys, Request, Sink, coded_answer
from areal_watchdog.notify.sinks.signing import dingtalk_sign

MAX_BODY_BYTES = 20_000
TOO_FAST = 130101


SECRETS = {
    "url": "the robot's webhook URL (.../robot/send?access_token=...)",
    "secret": "the robot's signing secret (SEC...)",
}


class DingTalkSink(Sink):
    type = "dingtalk"
    pace = 3.0  # 20 messages a minute per robot
    keys = Keys(SECRETS, (("url",), ("secret",)))

    def report(self, report: dict[str, Any]) -> dict[str, Any]:
        return fit(_markdown, report, MAX_BODY_BYTES)

    def note(self, text: str, thread: dict[str, str] | None) -> dict[str, Any]:
        return {"msgtype": "text", "text": {"content": text}}

    def request(self, values: dict[str, str], body: bytes, message_id: str, now: float) -> Request:
        timestamp = int(now * 1000)
        url = values["url"]
        joiner = "&" if "?" in url else "?"
        sign = quote_plus(dingtalk_sign(values["secret"], timestamp))
        return Request(f"{url}{joiner}timestamp={timestamp}&sign={sign}", body)

    def answer(self, text: str) -> Answer:
        return coded_answer(text, "DingTalk", ("errcode",), ("errmsg",), TOO_FAST)


def _markdown(report: dict[str, Any], shown: int) -> dict[str, Any]:
    title = clip(headline(report), 100)
    lines = [f"### {title}", "", f"**{_plain(clip(report['summary'], 2000))}**", ""]
    lines += [f"- **{k}**: {_plain(v)}" for k, v in facts(report)]
    stacks = group_lines(report, shown)
    if stacks:
        lines += ["", "#### Stacks", ""] + [f"- `{_plain(s)}`" for s in stacks]
    lines += ["", f"> Full report: {_plain(report_path(report))}"]
    return {"msgtype": "markdown", "markdown": {"title": title, "text": "\n".join(lines)}}


def _plain(text: str) -> str:
    """No backtick or newline of ours can break the markdown around it."""
    return text.replace("`", "'").replace("\n", " ")
