"""A real vLLM on 127.0.0.1 and clients that keep it full: shared by ``test_vllm.py`` and the
seconds benchmark's saturated-server row (``benchmarks/bench_seconds.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from areal_watchdog.common.interprocess.parent import die_with_parent
from areal_watchdog.evidence.rollout_side.servers import probe
from testkit.ports import free_port_pair

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
MAKE_TINY = REPO / "examples" / "areal" / "harness" / "make_tiny.py"


def make_vllm_model(root: Path) -> Path:
    """The tiny standard Qwen2 (head_dim 64) vLLM's CPU backend serves, made offline."""
    make = [sys.executable, str(MAKE_TINY), str(root), "--shape", "vllm"]
    subprocess.run(make, check=True, capture_output=True)
    return root / "tiny-qwen2"


@contextlib.contextmanager
def running_vllm(vllm_model: Path) -> Iterator[str]:
    """A real vLLM on 127.0.0.1, its pause endpoints on, two requests running at most (as a
    loaded server: the rest queue); ended with its whole session."""
    port = free_port_pair()
    argv = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(vllm_model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "256",
        "--enforce-eager",
        "--gpu-memory-utilization",
        "0.1",
        "--max-num-seqs",
        "2",
    ]  # fmt: skip (2 running: more clients queue)
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    # ended with pytest even when pytest itself is killed (its fixtures then never finish)
    server = subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=die_with_parent,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while probe(address, 1.0).get("state") != "up":
            assert server.poll() is None and time.monotonic() < deadline, "vLLM did not start"
            time.sleep(1)
        yield address
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


class Saturation:
    """Other clients keeping a server saturated: ``clients`` completions of ``tokens`` tokens
    always in flight (coroutines on a thread of their own: hundreds of them cost little), until
    the block ends; each request bounded in time."""

    def __init__(self, address: str, model: Path, clients: int, tokens: int) -> None:
        host, port = address.rsplit(":", 1)
        body = json.dumps({"model": str(model), "prompt": [5, 6, 7], "max_tokens": tokens,
                           "ignore_eos": True}).encode()  # fmt: skip
        self.request = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {address}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + body
        self.host, self.port, self.clients = host, int(port), clients
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._all()), daemon=True)

    async def _all(self) -> None:
        await asyncio.gather(*(self._client() for _ in range(self.clients)))

    async def _client(self) -> None:
        while not self.stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
                writer.write(self.request)
                await asyncio.wait_for(reader.read(), 120)
                writer.close()
            except (OSError, asyncio.TimeoutError):
                await asyncio.sleep(0.5)

    def __enter__(self) -> Saturation:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(150)


def tokens_per_second(address: str, seconds: float = 6.0) -> float:
    """The server's generation rate, from its own counter."""
    before, started = probe(address), time.monotonic()
    time.sleep(seconds)
    after = probe(address)
    generated = after.get("generated_tokens", 0.0) - before.get("generated_tokens", 0.0)
    return generated / (time.monotonic() - started)
