"""Loopback stand-ins for the chat and paging vendors: each checks a request as the vendor
does (its signature, its payload's schema, its size limit) and answers as the vendor answers
(Feishu and DingTalk refuse with HTTP 200 and an error code; PagerDuty 400; Teams 413).
``fail_first`` answers 503 to the first requests, to drive retries and the spool."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from areal_watchdog.notify.sinks.signing import dingtalk_sign, feishu_sign

HOUR = 3600
ROUTING_KEY = "R0UT1NGKEY0123456789abcdefABCDEF"  # PagerDuty's keys are 32 characters


@dataclass
class Seen:
    """One request and what the vendor would have found wrong with it."""

    path: str
    query: dict[str, str]
    body: bytes
    problems: list[str]
    at: float = field(default_factory=time.time)

    def json(self) -> Any:
        return json.loads(self.body)


def feishu_problems(seen: Seen, secret: str) -> list[str]:
    problems = _size(seen.body, 20 * 1024)
    message = _json(seen.body, problems)
    timestamp = str(message.get("timestamp", ""))
    fresh = timestamp.isdigit() and abs(time.time() - int(timestamp)) <= HOUR
    if not fresh or message.get("sign") != feishu_sign(secret, int(timestamp)):
        problems.append("sign match fail or timestamp is not within one hour")
    kind = message.get("msg_type")
    if kind == "interactive":
        card = message.get("card") or {}
        if not (card.get("header") or {}).get("title", {}).get("content"):
            problems.append("card.header.title.content is missing")
        for element in card.get("elements") or [None]:
            if not isinstance(element, dict) or element.get("tag") not in FEISHU_TAGS:
                problems.append(f"card element {element!r} is not a card element")
    elif kind == "text":
        if not (message.get("content") or {}).get("text"):
            problems.append("content.text is missing")
    else:
        problems.append(f"msg_type {kind!r} is not a message type")
    return problems


FEISHU_TAGS = {"div", "hr", "note", "markdown", "img", "action", "column_set"}


def dingtalk_problems(seen: Seen, secret: str) -> list[str]:
    problems = _size(seen.body, 20_000)
    timestamp = seen.query.get("timestamp", "")
    if not seen.query.get("access_token"):
        problems.append("access_token is missing")
    if not timestamp.isdigit() or abs(time.time() * 1000 - int(timestamp)) > HOUR * 1000:
        problems.append("sign not match (timestamp)")
    elif seen.query.get("sign") != dingtalk_sign(secret, int(timestamp)):
        problems.append("sign not match")
    message = _json(seen.body, problems)
    kind = message.get("msgtype")
    part = message.get(kind) if isinstance(kind, str) else None
    wanted = {"markdown": ("title", "text"), "text": ("content",)}.get(str(kind))
    if wanted is None or not isinstance(part, dict) or not all(part.get(k) for k in wanted):
        problems.append(f"msgtype {kind!r} lacks {wanted}")
    return problems


def pagerduty_problems(seen: Seen, routing_key: str) -> list[str]:
    problems = _size(seen.body, 512 * 1024)
    event = _json(seen.body, problems)
    if event.get("routing_key") != routing_key:
        problems.append("routing_key is invalid")
    action = event.get("event_action")
    if action not in ("trigger", "acknowledge", "resolve"):
        problems.append(f"event_action {action!r} is invalid")
    if not 0 < len(str(event.get("dedup_key", ""))) <= 255:
        problems.append("dedup_key must be 1-255 characters")
    if action == "trigger":
        payload = event.get("payload") or {}
        if not 0 < len(str(payload.get("summary", ""))) <= 1024:
            problems.append("payload.summary must be 1-1024 characters")
        if not payload.get("source"):
            problems.append("payload.source is missing")
        if payload.get("severity") not in ("critical", "error", "warning", "info"):
            problems.append(f"payload.severity {payload.get('severity')!r} is invalid")
        try:
            datetime.fromisoformat(str(payload.get("timestamp")))
        except ValueError:
            problems.append("payload.timestamp is not ISO 8601")
    return problems


def teams_problems(seen: Seen, _secret: str) -> list[str]:
    problems = _size(seen.body, 28 * 1024)
    message = _json(seen.body, problems)
    attachments = message.get("attachments") or []
    if message.get("type") != "message" or len(attachments) != 1:
        return [*problems, "not a message with one attachment"]
    attachment = attachments[0]
    card = attachment.get("content") or {}
    if attachment.get("contentType") != "application/vnd.microsoft.card.adaptive":
        problems.append("the attachment is not an Adaptive Card")
    if card.get("type") != "AdaptiveCard" or not isinstance(card.get("version"), str):
        problems.append("content is not an AdaptiveCard with a version")
    for element in card.get("body") or [None]:
        kind = element.get("type") if isinstance(element, dict) else None
        if kind == "TextBlock" and not isinstance(element.get("text"), str):
            problems.append("a TextBlock without text")
        elif kind == "FactSet" and not all(
            isinstance(f.get("title"), str) and isinstance(f.get("value"), str)
            for f in element.get("facts", [])
        ):
            problems.append("a fact without a title or value")
        elif kind not in ("TextBlock", "FactSet", "Container", "ColumnSet", "ActionSet"):
            problems.append(f"element {kind!r} is not an Adaptive Card element")
    return problems


def _size(body: bytes, limit: int) -> list[str]:
    return [f"body of {len(body)} bytes is over {limit}"] if len(body) > limit else []


def _json(body: bytes, problems: list[str]) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        problems.append("the body is not a JSON object")
        return {}
    return value


CHECKS = {
    "feishu": feishu_problems,
    "dingtalk": dingtalk_problems,
    "pagerduty": pagerduty_problems,
    "teams": teams_problems,
}


def answer(vendor: str, problems: list[str], body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The vendor's answer: accepted, or refused its way."""
    if vendor == "feishu":
        signed = any("sign" in p for p in problems)
        code = 19021 if signed else 9499
        return 200, {"code": code, "msg": "; ".join(problems)} if problems else {
            "code": 0, "msg": "success", "data": {}}  # fmt: skip
    if vendor == "dingtalk":
        code = 310000 if any("sign" in p for p in problems) else 300001
        return 200, {"errcode": code, "errmsg": "; ".join(problems)} if problems else {
            "errcode": 0, "errmsg": "ok"}  # fmt: skip
    if vendor == "pagerduty":
        if problems:
            return 400, {"status": "invalid event", "message": "Event object is invalid",
                         "errors": problems}  # fmt: skip
        return 202, {"status": "success", "message": "Event processed",
                     "dedup_key": body.get("dedup_key")}  # fmt: skip
    return (
        (413 if any("over" in p for p in problems) else 400, {"error": problems})
        if (problems)
        else (202, {})
    )


class StandIn:
    """One vendor on 127.0.0.1. ``accepted``: the messages it took."""

    def __init__(self, vendor: str, secret: str = "", fail_first: int = 0) -> None:
        self.vendor, self.secret, self.fail_first = vendor, secret, fail_first
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                parts = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(parts.query))
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                seen = Seen(parts.path, query, body, [])
                seen.problems = CHECKS[vendor](seen, outer.secret)
                with outer.lock:
                    outer.seen.append(seen)
                    failing = len(outer.seen) <= outer.fail_first
                status, reply = (503, {"error": "unavailable"}) if failing else answer(
                    vendor, seen.problems, _json(body, []))  # fmt: skip
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_port}{path}"

    @property
    def accepted(self) -> list[dict[str, Any]]:
        """What the vendor took: valid requests past the scripted failures."""
        return [s.json() for s in self.seen[self.fail_first :] if not s.problems]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def vendor_sinks(standins: dict[str, StandIn]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """``watchdog.notify`` entries for the stand-ins, and the environment holding their
    secrets (a URL with its token in it, a signing secret, a routing key)."""
    env: dict[str, str] = {}
    items: list[dict[str, Any]] = []
    for vendor, standin in standins.items():
        upper = vendor.upper()
        if vendor == "pagerduty":
            env[f"{upper}_KEY"] = ROUTING_KEY
            items.append({"type": vendor, "routing_key_env": f"{upper}_KEY",
                          "api_url": standin.url("/v2/enqueue")})  # fmt: skip
            continue
        paths = {
            "feishu": "/open-apis/bot/v2/hook/f1ca7e00-hook-token",
            "dingtalk": "/robot/send?access_token=d1n6ta1k0accesstoken",
            "teams": "/workflows/t3amsw0rkfl0w/triggers/manual/paths/invoke?sig=s1gn4ture",
        }
        env[f"{upper}_URL"] = standin.url(paths[vendor])  # fmt: skip
        item = {"type": vendor, "url_env": f"{upper}_URL"}
        if standin.secret:
            env[f"{upper}_SECRET"] = standin.secret
            item["secret_env"] = f"{upper}_SECRET"
        items.append(item)
    return items, env


SECRETS = {"feishu": "feishu-sign-secret-1234", "dingtalk": "SECd1ngta1ksecret5678", "teams": ""}


def start_all(fail_first: int = 0) -> dict[str, StandIn]:
    return {
        vendor: StandIn(vendor, SECRETS.get(vendor, ROUTING_KEY if vendor == "pagerduty" else ""),
                        fail_first)
        for vendor in CHECKS
    }  # fmt: skip
