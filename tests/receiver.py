"""A real HTTP receiver on 127.0.0.1 for the notification tests, with scripted answers."""

from __future__ import annotations

import json
import threading
import time
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


class Receiver:
    """Answers with the scripted (status, headers, delay) in order, then 200 for the rest."""

    def __init__(self, secret: str = "", port: int = 0) -> None:
        self.secret = secret
        self.script: list[tuple[int, dict[str, str], float]] = []
        self.requests: list[Received] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = dict(self.headers)
                ok = verify(body, headers, outer.secret) if outer.secret else False
                outer.requests.append(Received(self.path, headers, body, ok))
                status, extra, delay = outer.script.pop(0) if outer.script else (200, {}, 0.0)
                time.sleep(delay)
                try:
                    self.send_response(status)
                    for name, value in extra.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(b"go away: token=hunter2secret" if status == 400 else b"ok")
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

    def delivered_ids(self, path: str = "/hook") -> list[str]:
        return [r.headers["webhook-id"] for r in self.requests if r.path == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
