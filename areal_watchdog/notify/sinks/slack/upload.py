"""An incident's timeline picture, uploaded into its Slack thread through Slack's current
upload API (``files.upload`` is retired): ``files.getUploadURLExternal`` for a URL, the PNG's
bytes posted to it, then ``files.completeUploadExternal`` shares it in the channel, as a reply
to the report's first post. Only a sink with a bot token has a thread to reply in."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path
from typing import Any

import requests

from areal_watchdog.common.secrets.redact import Redactor
from areal_watchdog.config.sinks import ResolvedSink
from areal_watchdog.notify.sinks.deadline_post import post_within

FORM = "application/x-www-form-urlencoded"
JSON = "application/json; charset=utf-8"


class UploadRefused(Exception):
    """Slack answered 200 with ``ok: false`` (its way to refuse)."""


def upload_picture(
    sink: ResolvedSink,
    api_url: str,
    thread: dict[str, str],
    png: Path,
    title: str,
    redactor: Redactor,
) -> str:
    """Share ``png`` in ``thread`` (its channel and first post's ts) through the API whose
    ``chat.postMessage`` is ``api_url``; what happened, in a few words (never the token)."""
    data = png.read_bytes()
    api = api_url.rsplit("/", 1)[0]  # .../api/chat.postMessage -> .../api
    form = urllib.parse.urlencode({"filename": png.name, "length": len(data)}).encode()
    share = {"channel_id": thread["channel"], "thread_ts": thread["ts"]}
    try:
        ticket = _answer(_post(sink, f"{api}/files.getUploadURLExternal", form, FORM))
        sent = _post(sink, str(ticket["upload_url"]), data, "image/png", token=False)
        if not 200 <= sent.status_code < 300:
            return f"not uploaded: HTTP {sent.status_code}"
        share["files"] = [{"id": ticket["file_id"], "title": title}]
        _answer(
            _post(sink, f"{api}/files.completeUploadExternal", json.dumps(share).encode(), JSON)
        )
    except (requests.RequestException, UploadRefused, KeyError) as exc:
        return redactor.scrub(f"not uploaded: {type(exc).__name__}: {exc}")[:300]
    return f"uploaded {png.name} ({len(data):,} bytes) into the thread"


def _post(sink: ResolvedSink, url: str, body: bytes, content_type: str, token: bool = True) -> Any:
    """One request; the token only to Slack's API (the upload URL is signed already: the
    token never travels to another host)."""
    headers = {"User-Agent": "areal-watchdog", "Content-Type": content_type}
    if token:
        headers["Authorization"] = f"Bearer {sink.values['token']}"
    return post_within(sink.spec.timeout, url, body, headers)


def _answer(response: Any) -> dict[str, Any]:
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or answer.get("ok") is not True:
        error = answer.get("error") if isinstance(answer, dict) else "the answer is not JSON"
        raise UploadRefused(f"Slack API: {error or 'not ok'}")
    return answer
