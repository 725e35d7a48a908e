"""A real HTTP receiver on 127.0.0.1 for the notification tests and benchmarks, with scripted
answers."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from areal_watchdog.notify.envelope import verify


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    verified: bool
    at: float = field(default_factory=time.monotonic)
    wall: float = field(default_factory=time.time)

    def json(self) -> Any:
        return json.loads(self.body)


SLACK_FILE_LIMIT = 1 << 30  # Slack's limit on an uploaded file
REFUSED_UPLOAD = b"length mismatch or over the limit"


def slack_answer(body: bytes, count: int) -> bytes:
    """What ``chat.postMessage`` answers: ok, the channel, and the new message's ts."""
    channel = json.loads(body).get("channel")
    return json.dumps({"ok": True, "channel": channel, "ts": f"1795600000.{count:06d}"}).encode()


class Receiver:
    """Answers with the scripted (status, headers, delay) in order, then 200 for the rest."""

    def __init__(self, secret: str = "", port: int = 0) -> None:
        self.secret = secret
        self.script: list[tuple[int, dict[str, str], float]] = []
        self.requests: list[Received] = []
        self.upload_length = -1  # what the last files.getUploadURLExternal announced
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = dict(self.headers)
                ok = verify(body, headers, outer.secret) if outer.secret else False
                outer.requests.append(Received(self.path, headers, body, ok))
                status, extra, delay = outer.script.pop(0) if outer.script else (200, {}, 0.0)
                time.sleep(delay)
                answer = b"go away: token=hunter2secret" if status == 400 else b"ok"
                if self.path.endswith("/chat.postMessage"):  # Slack's Web API, as a bot posts
                    answer = slack_answer(body, len(outer.requests))
                elif "/files." in self.path or self.path.startswith("/upload/"):
                    answer = outer.slack_upload(self.path, body)
                    status = 400 if answer == REFUSED_UPLOAD else status
                try:
                    self.send_response(status)
                    for name, value in extra.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(answer)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (the "never answers" test)

            def log_message(self, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def slack_upload(self, path: str, body: bytes) -> bytes:
        """Slack's upload API as a bot uses it: a URL for the file (its announced length
        kept), the bytes posted there (refused when they are not that length or over Slack's
        1 GB), then the share."""
        if path.endswith("/files.getUploadURLExternal"):
            form = urllib.parse.parse_qs(body.decode())
            self.upload_length = int(form["length"][0])
            url = self.url("/upload/F0TIMELINE")
            return json.dumps({"ok": True, "upload_url": url, "file_id": "F0TIMELINE"}).encode()
        if path.startswith("/upload/"):
            ok = len(body) == self.upload_length and len(body) < SLACK_FILE_LIMIT
            return b"OK - %d" % len(body) if ok else REFUSED_UPLOAD
        return json.dumps({"ok": True, "files": [{"id": "F0TIMELINE"}]}).encode()

    def delivered_ids(self, path: str = "/hook") -> list[str]:
        return [r.headers["webhook-id"] for r in self.requests if r.path == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Trickler:
    """A hostile receiver on 127.0.0.1: reads the request, then sends a valid 200 response one
    byte every ``interval`` seconds, status line first. No single read ever waits ``interval``
    or longer, so only a total deadline ends an attempt. ``hung_up`` counts connections the
    client closed before the response was complete."""

    RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n" + b"x" * 40

    def __init__(self, interval: float = 2.0) -> None:
        self.interval = interval
        self.stop = threading.Event()
        self.connections = 0
        self.hung_up = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while not self.stop.is_set():
                conn, _ = self.server.accept()
                self.connections += 1
                threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                for byte in self.RESPONSE:
                    conn.sendall(bytes([byte]))
                    if self.stop.wait(self.interval):
                        return
                    if _closed_by_peer(conn):
                        raise ConnectionResetError
            except OSError:
                self.hung_up += 1  # the client shut the connection before the end

    def close(self) -> None:
        self.stop.set()
        self.server.close()


def _closed_by_peer(conn: socket.socket) -> bool:
    try:
        return conn.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False  # open, nothing to read
