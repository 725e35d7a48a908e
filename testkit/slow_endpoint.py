"""A slow HTTP upload endpoint on 127.0.0.1 (an object store or experiment tracker behind a slow
link): it reads a request body 64 KB at a time, 5 times a second (320 KB/s), then answers 200.
The hang demo's ``upload`` phase posts its checkpoint here."""

from __future__ import annotations

import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

READ = 64 * 1024
PAUSE_S = 0.2


class _Slow(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        left = int(self.headers.get("Content-Length", 0))
        while left > 0:
            chunk = self.rfile.read(min(READ, left))
            if not chunk:
                return
            left -= len(chunk)
            time.sleep(PAUSE_S)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        return


class SlowEndpoint:
    """The endpoint, serving from a thread until ``close``."""

    def __init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
        self.server.daemon_threads = True
        Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/upload"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
