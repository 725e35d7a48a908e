"""An RL training loop with AReaL's rollout shape that can hang on its rollout side, on purpose.

Every rank trains a tiny policy (DDP on gloo) on batches that an async rollout client collects
from an inference server, started by local rank 0 like a rollout worker starts its server:
``demo.server: sglang`` is the SGLang stand-in (``examples/inference_server/sglang_standin.py``),
``demo.server: vllm`` a real vLLM (``demo.vllm_python -m vllm.entrypoints.openai.api_server``
serving ``demo.vllm_model`` on 127.0.0.1, its pause endpoints on: ``VLLM_SERVER_DEV_MODE=1``);
with ``demo.start_server: false`` the server already serving on ``demo.server_port`` (one that
other clients share).
The names follow AReaL's own (``prepare_batch ->
active_submit_and_wait -> wait_results`` on the training thread; ``_execute_workflow ->
arun_episode -> agenerate -> arequest_with_retry`` as coroutines on an ``AsyncTaskRunner``
thread), so that the watchdog sees what it sees in a real AReaL job. ``demo.hang`` picks:

  none                 a healthy run
  inference_paused     the weight update pauses generation at ``hang_step`` and never resumes
  inference_dead       the inference server dies at ``hang_step``
  inference_wedged     the server stops answering anything (health too) after some requests
  staleness_blocked    the per-worker rollout limit divided by the rollout DP size is 0
  workflow_failing     from ``hang_step`` every episode raises; it is rejected and resubmitted
  weight_sync_stuck    the trainer broadcasts new weights; the server refuses the transfer
                       (dtype mismatch) and never enters recv
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import torch
import torch.distributed as dist
import yaml
from torch.nn.parallel import DistributedDataParallel

STANDIN = Path(__file__).resolve().parents[1] / "inference_server" / "sglang_standin.py"
# torchrun's variables: a server started by a rank is no rank (vLLM reads some of them)
TORCH_RUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")  # fmt: skip
GREEN, RESET = "\x1b[32m", "\x1b[0m"


# ----------------------------------------------------------------------- the rollout side
async def arequest_with_retry(addr: str, endpoint: str, payload: dict, max_retries: int = 3):
    """POST JSON like AReaL's client: long timeouts, retries on connection errors."""
    url = f"http://{addr}{endpoint}"
    for attempt in range(max_retries):
        try:
            return await asyncio.wait_for(_post(addr, endpoint, payload), timeout=3600)
        except OSError as exc:
            print(f"request to {url} failed ({exc}); retry {attempt + 1}", flush=True)
            await asyncio.sleep(2.0 * (attempt + 1))
    raise ConnectionError(f"{url}: no answer after {max_retries} attempts")


async def _post(addr: str, endpoint: str, payload: dict) -> dict:
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps(payload).encode()
    writer.write(
        f"POST {endpoint} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    raw = await reader.read()
    writer.close()
    return json.loads(raw.split(b"\r\n\r\n", 1)[1] or b"{}")


class Workflow:
    """One episode: generate a completion, score it; may fail on purpose."""

    def __init__(self, addr: str, fail_from_version: int | None, vllm_model: str = "") -> None:
        self.addr = addr
        self.fail_from_version = fail_from_version
        self.vllm_model = vllm_model

    async def arun_episode(self, prompt: list[int], version: int) -> dict:
        out = await self.agenerate(prompt)
        if self.fail_from_version is not None and version >= self.fail_from_version:
            raise ValueError("reward function: cannot parse the answer (None)")
        return {"ids": prompt + out["output_ids"], "reward": float(len(out["output_ids"]) % 3)}

    async def agenerate(self, prompt: list[int]) -> dict:
        if self.vllm_model:  # AReaL's vLLM client: OpenAI completions with token ids
            payload = {"model": self.vllm_model, "prompt": prompt, "max_tokens": 8}
            out = await arequest_with_retry(self.addr, "/v1/completions", payload)
            return {"output_ids": list(out["choices"][0]["text"].encode())}
        payload = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 8}}
        return await arequest_with_retry(self.addr, "/generate", payload)


class StalenessManager:
    """AReaL's capacity rule: how many more rollouts may start without becoming too stale."""

    def __init__(self, max_concurrent: int, max_head_offpolicyness: int, consumer_bs: int):
        self.max_concurrent = max_concurrent
        self.max_head_offpolicyness = max_head_offpolicyness
        self.consumer_bs = consumer_bs
        self.accepted = self.running = 0

    def get_capacity(self, version: int) -> int:
        fresh = (self.max_head_offpolicyness + version + 1) * self.consumer_bs
        return min(self.max_concurrent - self.running, fresh - (self.accepted + self.running))


class WorkflowExecutor:
    """Submits episodes to the async runner and waits for enough accepted results."""

    def __init__(self, workflow: Workflow, staleness: StalenessManager) -> None:
        self.workflow = workflow
        self.staleness = staleness
        self.loop = asyncio.new_event_loop()
        self.cond = threading.Condition()
        self.results: list[dict] = []
        threading.Thread(target=self.loop.run_forever, name="AsyncTaskRunner", daemon=True).start()

    def prepare_batch(self, size: int, version: int) -> list[dict]:
        return self.active_submit_and_wait(size, version)

    def active_submit_and_wait(self, size: int, version: int) -> list[dict]:
        submitted = 0
        while submitted < size:
            while self.staleness.get_capacity(version) <= 0:
                self.wait_for_capacity()
            self.staleness.running += 1
            prompt = [submitted + 1, version + 2, 7]
            coro = self._execute_workflow(prompt, version)
            asyncio.run_coroutine_threadsafe(coro, self.loop)
            submitted += 1
        return self.wait_results(size)

    def wait_for_capacity(self) -> None:
        with self.cond:
            self.cond.wait(timeout=1.0)

    def wait_results(self, size: int) -> list[dict]:
        with self.cond:
            while len(self.results) < size:
                self.cond.wait()
            batch, self.results = self.results[:size], self.results[size:]
        return batch

    async def _execute_workflow(self, prompt: list[int], version: int) -> None:
        while True:
            try:
                result = await self.workflow.arun_episode(prompt, version)
                break
            except Exception as exc:  # noqa: BLE001 - AReaL rejects the episode and moves on
                print(f"episode rejected ({type(exc).__name__}: {exc}); resubmitting", flush=True)
                await asyncio.sleep(0.2)
        with self.cond:
            self.staleness.running -= 1
            self.staleness.accepted += 1
            self.results.append(result)
            self.cond.notify_all()


# ------------------------------------------------------------------------ the server side
def start_server(port: int, cfg: dict) -> subprocess.Popen:
    """The inference server on 127.0.0.1:``port``, once it answers /health."""
    env = {k: v for k, v in os.environ.items() if k not in TORCH_RUN_ENV}
    if cfg.get("server") == "vllm":
        argv = [cfg["vllm_python"], "-m", "vllm.entrypoints.openai.api_server", "--model",
                cfg["vllm_model"], "--host", "127.0.0.1", "--port", str(port), "--dtype",
                "float32", "--max-model-len", "256", "--enforce-eager",
                "--gpu-memory-utilization", "0.1"]  # fmt: skip
        env.update(VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE="1")
    else:
        argv = [sys.executable, str(STANDIN), "--port", str(port)]
        if cfg["hang"] == "inference_wedged":
            argv += ["--wedge-after", str(4 * int(cfg["hang_step"]))]  # 12 at step 3
    server = subprocess.Popen(argv, env=env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and server.poll() is None:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return server
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the inference server did not start")


def post(addr: str, endpoint: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"http://{addr}{endpoint}",
        data=json.dumps(body or {}).encode(),
        headers={"Content-Type": "application/json"},
    )
    return json.loads(urllib.request.urlopen(request, timeout=30).read() or b"{}")


def update_weights_from_disk(addr: str, skip_resume: bool, vllm: bool) -> None:
    """AReaL's disk weight update: pause generation, load, resume (#1160 forgets to resume).
    On vLLM, its own pause and resume (``mode=keep``: requests wait in the engine's queue)."""
    if vllm:
        post(addr, "/pause?mode=keep")
        if not skip_resume:
            post(addr, "/resume")
        return
    post(addr, "/pause_generation")
    post(addr, "/update_weights_from_disk", {"model_path": "/tmp/ckpt"})
    if not skip_resume:
        post(addr, "/continue_generation")


def update_weights_from_distributed(model: torch.nn.Module, port: int) -> None:
    """Send the weights to the inference server over a group of their own (#1439): the server
    refuses the request and never joins, so the broadcast waits for a receiver forever."""
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=True, timeout=datetime.timedelta(0, 3600))
    group = dist.ProcessGroupGloo(store, 0, 2, datetime.timedelta(seconds=3600))
    for param in model.parameters():
        group.broadcast([param.detach().clone()], 0).wait()


# -------------------------------------------------------------------------------- the loop
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    cfg = yaml.safe_load(Path(parser.parse_args().config).read_text())["demo"]
    local_rank_0 = os.environ.get("LOCAL_RANK", "0") == "0"
    starts = local_rank_0 and cfg.get("start_server", True)
    server = start_server(int(cfg["server_port"]), cfg) if starts else None
    try:
        train(cfg, server)
    finally:
        if server is not None:
            server.kill()


def train(cfg: dict, server: subprocess.Popen | None) -> None:
    """The loop: collect a batch of rollouts, take a step, update the inference weights."""
    hang, hang_step = cfg["hang"], int(cfg["hang_step"])
    addr = f"127.0.0.1:{cfg['server_port']}"
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3600))
    rank, world = dist.get_rank(), dist.get_world_size()
    limit = int(cfg["max_concurrent_rollouts"]) // (world if hang == "staleness_blocked" else 1)
    staleness = StalenessManager(limit, int(cfg["max_head_offpolicyness"]), int(cfg["batch"]))
    fail_from = hang_step if hang == "workflow_failing" else None
    vllm_model = cfg["vllm_model"] if cfg.get("server") == "vllm" else ""
    executor = WorkflowExecutor(Workflow(addr, fail_from, vllm_model), staleness)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = int(cfg["steps"])
    for step in range(1, steps + 1):
        if hang == "inference_dead" and step == hang_step and server is not None:
            server.kill()  # the inference server dies (out of memory, a CUDA error, ...)
        batch = executor.prepare_batch(int(cfg["batch"]), version=step - 1)
        x = torch.tensor([[len(b["ids"]), b["reward"], step, 1.0] for b in batch])
        loss = model(x).pow(2).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
        if rank == 0:
            if hang == "weight_sync_stuck" and step == hang_step:
                update_weights_from_distributed(model.module, int(cfg["server_port"]) + 1)
            forget_resume = hang == "inference_paused" and step == hang_step
            update_weights_from_disk(addr, skip_resume=forget_resume, vllm=bool(vllm_model))
            print(
                f"(AReaL) StatsLogger INFO: Epoch 1/1 Step {step}/{steps} "
                f"{GREEN}Train step {step}/{steps} done.{RESET}",
                flush=True,
            )
        dist.barrier()
        time.sleep(float(cfg["step_time"]))
    dist.barrier()
    if rank == 0:
        print("Training completes!", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
