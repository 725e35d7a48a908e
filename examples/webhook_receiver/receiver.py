"""A minimal receiver for areal-watchdog's signed webhooks: verify, deduplicate, store.

    HANG_WEBHOOK_SECRET=... python examples/webhook_receiver/receiver.py --port 8787 --out ./inbox

It listens on 127.0.0.1 only, checks the Standard Webhooks signature (``webhook-id``,
``webhook-timestamp``, ``webhook-signature``) against the shared secret, answers 401 to a bad
signature, and stores each delivery id once (retries of a delivered id are acknowledged, not
stored again). Point a sink at it with ``url_env`` holding ``http://127.0.0.1:8787/hook``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from areal_watchdog.notify.envelope import verify


class Handler(BaseHTTPRequestHandler):
    secret: str = ""
    inbox: Path = Path("inbox")

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if not verify(body, dict(self.headers), self.secret):
            self.send_response(401)
            self.end_headers()
            self.wfile.write(b"bad signature")
            return
        delivery = self.inbox / f"{self.headers['webhook-id']}.json"
        if not delivery.exists():  # a retry of something already stored is acknowledged only
            envelope = json.loads(body)
            delivery.write_bytes(body)
            verdict = envelope["verdict"]
            print(
                f"{envelope['event_type']}: {verdict['category']} culprit ranks "
                f"{verdict['culprit_ranks']} - {verdict['summary']}",
                flush=True,
            )
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8787)
    parser.add_argument("--out", type=Path, default=Path("inbox"))
    args = parser.parse_args()
    secret = os.environ.get("HANG_WEBHOOK_SECRET")
    if not secret:
        print("set HANG_WEBHOOK_SECRET to the secret the watchdog signs with", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    Handler.secret, Handler.inbox = secret, args.out
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening on http://127.0.0.1:{server.server_port}/hook", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
