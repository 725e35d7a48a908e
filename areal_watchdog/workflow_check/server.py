"""The persistent inference server the check runs against: ``--server URL`` (checked before
anything loads, and its API told by what it answers), or a vLLM the command starts from the
config's model on 127.0.0.1 and ends with itself."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import open_append
from areal_watchdog.common.errors import UserError
from areal_watchdog.common.interprocess.http import server_address
from areal_watchdog.common.interprocess.parent import die_with_parent
from areal_watchdog.common.interprocess.ports import free_port
from areal_watchdog.config.model import JobConfig
from areal_watchdog.evidence.rollout_side.servers import probe

START_TIMEOUT = 900.0  # seconds: vLLM's start on a busy CPU took 60-90 s, a large model more
PROGRESS_EVERY = 15.0
# AReaL's vllm section (vLLMConfig) keys the server takes as flags.
VLLM_KEYS = ("dtype", "max_model_len", "gpu_memory_utilization", "max_num_seqs", "seed")


@dataclass(frozen=True)
class Server:
    """Where the server listens (``host:port``), which AReaL client speaks its API, and how it
    came to be (for the report)."""

    address: str
    engine: str  # vllm (OpenAI completions) | sglang
    origin: str


def given_server(url: str) -> Server:
    """A server named on the command line, refused in one line when it does not answer."""
    address = server_address(url)
    answer = probe(address, 5.0)
    if answer["state"] != "up":
        reason = answer.get("error") or f"/health answered {answer.get('health_status')}"
        raise UserError(
            f"--server {url}: {answer['state']} ({reason}): start it, or pass the URL of a "
            "server that answers /health"
        )
    engine = "sglang" if answer.get("engine") == "sglang" else "vllm"
    return Server(address, engine, f"--server ({'SGLang' if engine == 'sglang' else 'OpenAI'} API)")


def vllm_command(config: JobConfig, python: str, port: int, extra: list[str]) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server`` for ``actor.path`` on loopback, with the
    config's ``vllm`` section's flags (``max_model_len`` from ``sglang.context_length`` when
    only that is set) and ``extra`` last."""
    raw = config.raw
    model = (raw.get("actor") or {}).get("path")
    if not model:
        raise UserError(f"{config.source}: `actor.path`: no model to serve: set it, or --server")
    section: dict[str, Any] = dict(raw.get("vllm") or {})
    section.setdefault("dtype", (raw.get("actor") or {}).get("dtype"))
    section.setdefault("max_model_len", (raw.get("sglang") or {}).get("context_length"))
    flags = [f"--{k.replace('_', '-')}={section[k]}" for k in VLLM_KEYS if section.get(k)]
    eager = ["--enforce-eager"] if section.get("enforce_eager") else []
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(port), *flags, *eager, *extra]  # fmt: skip


@contextlib.contextmanager
def started_vllm(config: JobConfig, python: str, extra: list[str], log: Path) -> Iterator[Server]:
    """A vLLM server of the config's model, up before the check and ended after it."""
    port = free_port()
    argv = vllm_command(config, python, port, extra)
    print(f"[check-workflow] starting vLLM for {argv[4]} on 127.0.0.1:{port} (log: {log})")
    with open_append(log) as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True, preexec_fn=die_with_parent)  # fmt: skip
    try:
        _wait_up(server, f"127.0.0.1:{port}", log)
        yield Server(f"127.0.0.1:{port}", "vllm", f"vLLM started here from {argv[4]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def _wait_up(server: subprocess.Popen[bytes], address: str, log: Path) -> None:
    start = last = time.monotonic()
    while probe(address, 2.0)["state"] != "up":
        if server.poll() is not None:
            raise UserError(
                f"the vLLM server exited with code {server.returncode}: {last_line(log)} "
                f"(log: {log}); or pass --server URL"
            )
        now = time.monotonic()
        if now - start > START_TIMEOUT:
            raise UserError(f"the vLLM server did not answer in {START_TIMEOUT:g} s (log: {log})")
        if now - last >= PROGRESS_EVERY:
            print(f"[check-workflow] waiting for vLLM: {now - start:.0f} s", flush=True)
            last = now
        time.sleep(1)


def last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else "no output"
