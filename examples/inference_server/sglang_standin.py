"""A stand-in for an SGLang server: the subset of its HTTP API that AReaL's client calls.

There is no CPU build of SGLang here, so tests and demos run this instead. It speaks the same
protocol as SGLang's HTTP server for every endpoint AReaL's ``RemoteSGLangEngine`` calls (read in
AReaL 1.0.4 and 2.0.0: ``areal/engine/sglang_remote.py``, ``areal/infra/remote_inf_engine.py``;
2.0 launches it as ``areal.v2.inference_service.sglang.launch_server``), plus the ones our
probes read, and it only ever listens on a loopback address:

- ``GET /health``, ``/health_generate``, ``/v1/models``, ``/get_model_info``,
  ``/get_server_info``, ``/metrics`` (Prometheus text: ``sglang:num_running_reqs``,
  ``sglang:num_queue_reqs``, ``sglang:gen_throughput``, ``sglang:is_paused``,
  ``sglang:generation_tokens_total``, ``sglang:num_requests_total``);
- ``POST /generate`` (``input_ids``, ``sampling_params`` with ``max_new_tokens``,
  ``temperature``, ``top_p``, ``top_k``, ``stop_token_ids``, ``ignore_eos``; answers
  ``output_ids`` and ``meta_info`` with ``output_token_logprobs`` ``[[logprob, id, None], ...]``
  and ``finish_reason`` ``stop``/``length``/``abort``; with ``logprob_start_len``, as AReaL 2.0
  scores a sequence, also ``input_token_logprobs`` for the prompt from that position);
- ``POST /pause_generation`` (as SGLang's default mode: running requests return at once with
  ``abort`` and their partial output, new ones wait), ``/continue_generation``,
  ``/update_weights_from_disk`` (``model_path``: loaded before the answer, as AReaL deletes the
  folder right after), ``/flush_cache``, ``/release_memory_occupation``,
  ``/resume_memory_occupation``, ``/unload_lora_adapter`` (2.0, best effort: no LoRA here).

With ``--model-path`` tokens are sampled from a real causal LM (``transformers``, CPU), so the
trainer learns from real log-probabilities; without it they come from a seeded generator.
``--wedge-after N`` makes the server stop generating after N generate requests, as a wedged
scheduler does (the socket still accepts): generate requests and every GET (``/health``,
``/metrics``, ...) go unanswered, while pause, continue and weight updates still answer. The
trainer finishes the steps it has rollouts for and then waits for rollouts, whenever the wedge
falls in its step (a pause that never answered would hold it before its step line instead).
``--hold-update-after N`` makes it apply N weight updates and then never answer the next one,
while it still answers everything else: a lost weight update (AReaL's controller and rollout
worker then wait for it forever). With ``--hold-update-claim PATH`` only the first server to
create ``PATH`` does so, and writes its address there: one of several servers of a job.

``--die-after-update N`` SIGKILLs the server at the first generate request after its N-th weight
update (the rollout of the next step): a server process that is gone, its port refusing
connections, while AReaL's rollout worker resubmits its episodes against it.

``--stay-paused-after N`` answers the continue that follows its N-th pause and stays paused:
generation paused (AReaL pauses it around every weight update) and never resumed.

``python sglang_standin.py --port P [--host 127.0.0.1] [--model-path DIR] [--wedge-after N]
[--hold-update-after N [--hold-update-claim PATH]] [--die-after-update N]
[--stay-paused-after N]``
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import random
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

NO_OP_ENDPOINTS = (
    "/flush_cache", "/release_memory_occupation", "/resume_memory_occupation",
    "/unload_lora_adapter",
)  # fmt: skip


class Sampler:
    """Next tokens for a request: from a model when one is loaded, else seeded random ones."""

    def __init__(self, model_path: str | None, seed: int) -> None:
        self.lock = threading.Lock()  # one forward pass at a time; weights swap under it
        self.model = self.load(model_path) if model_path else None
        self.model_path = model_path
        self.seed = seed
        config = getattr(self.model, "config", None)
        self.eos = getattr(config, "eos_token_id", None)
        # A document separator belongs in prompts only: a trained model never emits it, a model
        # with random weights would (the harness's tiny model, harness/modeling_tiny.py).
        marks = ("doc_sep_token_id", "bad_sample_token_id")  # tokens the harness plants
        self.banned = [t for t in (getattr(config, m, None) for m in marks) if t is not None]

    @staticmethod
    def load(path: str) -> Any:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return model.eval()

    def reload(self, path: str) -> None:
        """New weights from disk, loaded before the caller is answered."""
        if self.model is None:
            return
        model = self.load(path)
        with self.lock:
            self.model, self.model_path = model, path

    def tokens(self, prompt: list[int], params: dict[str, Any], rid: int):
        """Yield ``(token, logprob)`` pairs; the caller stops when it must."""
        if self.model is None:
            rng = random.Random(hash(tuple(prompt)) ^ rid ^ self.seed)
            while True:
                yield rng.randrange(3, 250), -rng.random()
        yield from self._model_tokens(prompt, params, rid)

    def _model_tokens(self, prompt: list[int], params: dict[str, Any], rid: int):
        import torch

        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + rid)
        temperature = float(params.get("temperature", 1.0))
        ids, past = torch.tensor([prompt or [0]]), None
        while True:
            with self.lock, torch.no_grad():
                out = self.model(input_ids=ids, past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[0, -1].float()
            logits = _filtered(logits / max(temperature, 1e-5), params)
            logits[self.banned] = float("-inf")
            logprobs = torch.log_softmax(logits, dim=-1)
            if temperature <= 0:
                token = int(torch.argmax(logprobs))
            else:
                token = int(torch.multinomial(logprobs.exp(), 1, generator=generator))
            yield token, float(logprobs[token])
            ids = torch.tensor([[token]])


def _filtered(logits: Any, params: dict[str, Any]) -> Any:
    """``top_k`` (clamped to the vocabulary, as AReaL sends 1e8) and ``top_p`` filtering."""
    import torch

    top_k = min(int(params.get("top_k") or 0), logits.numel())
    if 0 < top_k < logits.numel():
        cutoff = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < cutoff, float("-inf"))
    top_p = float(params.get("top_p") or 1.0)
    if top_p < 1.0:
        ordered, index = torch.sort(logits, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(-1)
        drop = cumulative - torch.softmax(ordered, dim=-1) > top_p
        logits = logits.clone()
        logits[index[drop]] = float("-inf")
    return logits


class State:
    """What the server knows: paused, requests running and queued, tokens produced."""

    def __init__(
        self,
        sampler: Sampler,
        wedge_after: int | None,
        latency: float,
        hold_update_after: int | None = None,
    ) -> None:
        self.sampler = sampler
        self.lock = threading.Condition()
        self.paused = False
        self.pause_epoch = 0  # bumped by each pause: running requests abort when it changes
        self.running = 0
        self.queued = 0
        self.generated = 0
        self.requests = 0
        self.version = 0
        self.started = time.time()
        self.wedge_after = wedge_after
        self.latency = latency
        self.wedged = threading.Event()
        self.hold_update_after = hold_update_after
        self.die_after_update: int | None = None  # SIGKILL at a request after this many updates
        self.stay_paused_after: int | None = None  # the continue after this many pauses is lost

    def throughput(self) -> float:
        return self.generated / max(1e-6, time.time() - self.started)

    def pause(self, paused: bool) -> None:
        with self.lock:
            lost = self.stay_paused_after is not None and self.pause_epoch >= self.stay_paused_after
            self.paused = paused or lost
            self.pause_epoch += paused
            self.lock.notify_all()


class Handler(BaseHTTPRequestHandler):
    server_version = "sglang-standin/2"
    protocol_version = "HTTP/1.1"
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
        raw = self.rfile.read(length) if length else b"{}"  # AReaL's health GET has a body too
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        return body if isinstance(body, dict) else {}

    def _wedge_check(self) -> None:
        if self.state.wedged.is_set():
            threading.Event().wait()  # never answers, like a stuck scheduler

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._body()
        self._wedge_check()
        s = self.state
        model = s.sampler.model_path or "standin"
        if self.path in ("/health", "/health_generate"):
            self._reply({})
        elif self.path == "/v1/models":
            self._reply({"object": "list", "data": [{"id": model, "object": "model"}]})
        elif self.path == "/get_model_info":
            self._reply({"model_path": model, "is_generation": True})
        elif self.path == "/get_server_info":
            state = {"last_gen_throughput": s.throughput(), "paused": s.paused}
            info = {"version": "standin", "weight_version": s.version, "internal_states": [state]}
            self._reply(info)
        elif self.path == "/metrics":
            lines = [
                f"sglang:num_running_reqs {s.running}",
                f"sglang:num_queue_reqs {s.queued}",
                f"sglang:gen_throughput {s.throughput():.3f}",
                f"sglang:is_paused {int(s.paused)}",
                f"sglang:generation_tokens_total {s.generated}",
                f"sglang:num_requests_total {s.requests}",
            ]
            self._reply("\n".join(lines) + "\n", text=True)
        else:
            self._reply({"error": f"no such endpoint {self.path}"}, 404)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self._body()
        s = self.state
        if self.path == "/generate":
            self._wedge_check()
            self._reply(self._generate(body))
        elif self.path in ("/pause_generation", "/continue_generation"):
            s.pause(self.path == "/pause_generation")
            self._reply({"success": True})
        elif self.path == "/update_weights_from_disk":
            self._reply(self.update_weights_from_disk(str(body.get("model_path"))))
        elif self.path in NO_OP_ENDPOINTS:
            self._reply({"success": True})
        else:
            self._reply({"error": f"no such endpoint {self.path}"}, 404)

    def update_weights_from_disk(self, model_path: str) -> dict[str, Any]:
        """SGLang's update handler; with ``hold_update_after`` one update is lost: this request
        thread waits here forever, as a server whose weight load never completes."""
        s = self.state
        if s.hold_update_after is not None and s.version >= s.hold_update_after:
            threading.Event().wait()
        s.sampler.reload(model_path)
        s.version += 1
        return {"success": True, "message": f"loaded {model_path}"}

    def _generate(self, body: dict[str, Any]) -> dict[str, Any]:
        s = self.state
        with s.lock:
            s.requests += 1
            rid = s.requests
            if s.wedge_after is not None and s.requests > s.wedge_after:
                s.wedged.set()
            if s.die_after_update is not None and s.version >= s.die_after_update:
                os.kill(os.getpid(), signal.SIGKILL)
            s.queued += 1
            while s.paused or s.wedged.is_set():
                s.lock.wait()
            s.queued -= 1
            s.running += 1
            epoch = s.pause_epoch
        try:
            return self._tokens(body, rid, epoch)
        finally:
            with s.lock:
                s.running -= 1

    def _tokens(self, body: dict[str, Any], rid: int, epoch: int) -> dict[str, Any]:
        s = self.state
        params = body.get("sampling_params") or {}
        budget = max(0, int(params.get("max_new_tokens", 16)))
        stops = set(params.get("stop_token_ids") or [])
        if not params.get("ignore_eos") and s.sampler.eos is not None:
            stops.add(s.sampler.eos)
        prompt = list(body.get("input_ids") or [])
        pairs: list[tuple[int, float]] = []
        reason: dict[str, Any] = {"type": "length", "length": budget}
        for token, logprob in s.sampler.tokens(prompt, params, rid) if budget else ():
            if s.pause_epoch != epoch:  # paused mid-request: SGLang aborts with partial output
                reason = {"type": "abort", "message": "Abort in running"}
                break
            pairs.append((token, logprob))
            if token in stops:
                reason = {"type": "stop", "matched": token}
                break
            if len(pairs) >= budget:
                break
        time.sleep(s.latency)
        s.generated += len(pairs)
        if reason["type"] == "abort" and not pairs:
            reason["message"] = "Abort before prefill"
        meta = {
            "id": f"req-{rid}",
            "prompt_tokens": len(prompt),
            "completion_tokens": len(pairs),
            "finish_reason": reason,
            "output_token_logprobs": [[lp, t, None] for t, lp in pairs],
            "weight_version": s.version,
        }
        if body.get("logprob_start_len") is not None:  # AReaL 2.0 scoring a sequence
            start = max(0, int(body["logprob_start_len"]))
            scored = enumerate(prompt[start:], start)
            meta["input_token_logprobs"] = [[None if i == 0 else -1.0, t, None] for i, t in scored]
        return {"output_ids": [t for t, _ in pairs], "meta_info": meta}


def serve(host: str, port: int, model_path: str | None, wedge_after: int | None = None,
          latency: float = 0.0, seed: int = 1, hold_update_after: int | None = None,
          die_after_update: int | None = None,
          stay_paused_after: int | None = None) -> None:  # fmt: skip
    """Listen on ``host:port`` (a loopback address only) until killed."""
    if not ipaddress.ip_address(host).is_loopback:
        sys.exit(
            f"[sglang-standin] refusing to listen on {host}: the stand-in serves loopback only "
            "(run AReaL in a loopback-only network namespace, see docs/areal.md)"
        )
    Handler.state = State(Sampler(model_path, seed), wedge_after, latency, hold_update_after)
    Handler.state.die_after_update = die_after_update
    Handler.state.stay_paused_after = stay_paused_after
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    print(f"[sglang-standin] serving {model_path or 'random tokens'} on {host}:{port}", flush=True)
    server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--random-seed", type=int, default=1)
    parser.add_argument("--wedge-after", type=int, default=None)
    parser.add_argument("--latency", type=float, default=0.01)
    parser.add_argument("--hold-update-after", type=int, default=None)
    parser.add_argument("--hold-update-claim", default=None)
    parser.add_argument("--die-after-update", type=int, default=None)
    parser.add_argument("--stay-paused-after", type=int, default=None)
    args, _ = parser.parse_known_args(argv)  # SGLang's many other flags mean nothing here
    hold = args.hold_update_after
    if hold is not None and args.hold_update_claim:
        hold = hold if _claim(args.hold_update_claim, f"{args.host}:{args.port}") else None
    serve(args.host, args.port, args.model_path, args.wedge_after, args.latency, args.random_seed,
          hold, args.die_after_update, args.stay_paused_after)  # fmt: skip


def _claim(path: str, address: str) -> bool:
    """Create ``path`` holding ``address``; False when another server created it first."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as claimed:
        claimed.write(address)
    return True


if __name__ == "__main__":
    main()
