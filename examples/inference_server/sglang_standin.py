"""A stand-in for an SGLang server: the subset of its HTTP API that RL trainers call.

There is no CPU build of SGLang here, so tests and demos run this instead. It speaks the same
protocol as ``python -m sglang.launch_server`` for the endpoints AReaL's ``RemoteSGLangEngine``
and our probes use, and binds 127.0.0.1 only:

- ``GET /health``, ``/health_generate``, ``/get_model_info``, ``/get_server_info``, ``/metrics``
  (Prometheus text: ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
  ``sglang:gen_throughput``, ``sglang:is_paused``);
- ``POST /generate`` (``input_ids`` or ``text``, ``sampling_params.max_new_tokens``,
  ``return_logprob``; answers ``output_ids``, ``text`` and ``meta_info`` with
  ``output_token_logprobs`` and ``finish_reason``);
- ``POST /pause_generation``, ``/continue_generation`` (requests wait while paused),
  ``/update_weights_from_disk``, ``/flush_cache``.

Tokens come from a seeded generator (no model): enough for the protocol and for hangs.
``--wedge-after N`` makes the server stop answering anything after N generate requests, as a
wedged scheduler does (the socket still accepts).

``python sglang_standin.py --port P [--host 127.0.0.1] [--wedge-after N] [--latency S]``
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class State:
    """What the server knows: paused, requests running and queued, tokens produced."""

    def __init__(self, wedge_after: int | None, latency: float) -> None:
        self.lock = threading.Condition()
        self.paused = False
        self.running = 0
        self.queued = 0
        self.generated = 0
        self.requests = 0
        self.version = 0
        self.started = time.time()
        self.wedge_after = wedge_after
        self.latency = latency
        self.wedged = threading.Event()

    def throughput(self) -> float:
        return self.generated / max(1e-6, time.time() - self.started)


class Handler(BaseHTTPRequestHandler):
    server_version = "sglang-standin/1"
    state: State

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet, like SGLang at warning level
        pass

    def _reply(self, body: Any, status: int = 200, text: bool = False) -> None:
        data = (body if text else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if text else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        return body if isinstance(body, dict) else {}

    def _wedge_check(self) -> None:
        if self.state.wedged.is_set():
            threading.Event().wait()  # never answers, like a stuck scheduler

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._wedge_check()
        s = self.state
        if self.path in ("/health", "/health_generate"):
            self._reply({})
        elif self.path == "/get_model_info":
            self._reply({"model_path": "standin", "is_generation": True})
        elif self.path == "/get_server_info":
            self._reply(
                {
                    "version": "standin",
                    "weight_version": s.version,
                    "internal_states": [
                        {"last_gen_throughput": s.throughput(), "paused": s.paused}
                    ],
                }
            )
        elif self.path == "/metrics":
            lines = [
                f"sglang:num_running_reqs {s.running}",
                f"sglang:num_queue_reqs {s.queued}",
                f"sglang:gen_throughput {s.throughput():.3f}",
                f"sglang:is_paused {int(s.paused)}",
            ]
            self._reply("\n".join(lines) + "\n", text=True)
        else:
            self._reply({"error": f"no such endpoint {self.path}"}, 404)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self._wedge_check()
        body = self._body()
        s = self.state
        if self.path == "/generate":
            self._reply(self._generate(body))
        elif self.path in ("/pause_generation", "/continue_generation"):
            with s.lock:
                s.paused = self.path == "/pause_generation"
                s.lock.notify_all()
            self._reply({"success": True})
        elif self.path == "/update_weights_from_disk":
            s.version += 1
            self._reply({"success": True, "message": f"loaded {body.get('model_path')}"})
        elif self.path == "/flush_cache":
            self._reply({"success": True})
        else:
            self._reply({"error": f"no such endpoint {self.path}"}, 404)

    def _generate(self, body: dict[str, Any]) -> dict[str, Any]:
        s = self.state
        with s.lock:
            s.requests += 1
            if s.wedge_after is not None and s.requests > s.wedge_after:
                s.wedged.set()
            s.queued += 1
            while s.paused or s.wedged.is_set():
                s.lock.wait()
            s.queued -= 1
            s.running += 1
        try:
            return self._tokens(body)
        finally:
            with s.lock:
                s.running -= 1

    def _tokens(self, body: dict[str, Any]) -> dict[str, Any]:
        params = body.get("sampling_params") or {}
        count = max(1, int(params.get("max_new_tokens", 16)))
        prompt = body.get("input_ids") or list((body.get("text") or "").encode())
        rng = random.Random(hash(tuple(prompt)) ^ self.state.requests)
        ids = [rng.randrange(3, 250) for _ in range(count)]
        time.sleep(self.state.latency)
        self.state.generated += count
        return {
            "text": " ".join(map(str, ids)),
            "output_ids": ids,
            "meta_info": {
                "id": f"req-{self.state.requests}",
                "prompt_tokens": len(prompt),
                "completion_tokens": count,
                "finish_reason": {"type": "length", "length": count},
                "output_token_logprobs": [[-rng.random(), t, None] for t in ids],
                "weight_version": self.state.version,
            },
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--wedge-after", type=int, default=None)
    parser.add_argument("--latency", type=float, default=0.01)
    args = parser.parse_args(argv)
    Handler.state = State(args.wedge_after, args.latency)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"[sglang-standin] serving on {args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
