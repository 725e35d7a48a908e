"""Hangs on the rollout side of RL training, caught end to end and from recorded evidence.

The real runs use ``examples/rollout_hangs`` (AReaL's rollout shape, a real async HTTP client)
against ``examples/inference_server/sglang_standin.py`` on 127.0.0.1: what the user reads is
the category, the cause and the culprit server, and the stuck coroutine chain in the evidence.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from areal_watchdog.common.secrets.redact import Redactor
from areal_watchdog.diagnose.classify import classify
from areal_watchdog.evidence.model import Evidence
from areal_watchdog.evidence.rollout_side import rollout
from areal_watchdog.evidence.rollout_side.servers import probe
from areal_watchdog.rank.asyncio_tasks.tasks import TaskClock, snapshot
from areal_watchdog.report.build import IncidentContext, build_report
from areal_watchdog.report.write import write_incident
from areal_watchdog.rundir.layout import RunLayout
from conftest import REPO
from testkit.launcher import Launcher
from testkit.ports import free_port_pair

CONFIG = REPO / "examples" / "rollout_hangs" / "config.yaml"
STANDIN = REPO / "examples" / "inference_server" / "sglang_standin.py"
RECORDED = Path(__file__).parent / "data" / "rollout"
EVIDENCE = Path(__file__).parent / "data" / "evidence"
FAST = [
    "watchdog.stall_timeout=4",
    "watchdog.startup_timeout=30",  # a slow start under load is no stall (the hang is at step 3)
    "watchdog.poll_interval=0.25",
    "watchdog.on_hang=cancel",
]

# demo.hang, expected category, expected cause, is the server a culprit worker
CASES = [
    ("inference_paused", "rollout_stalled", "inference_paused", True),
    ("inference_dead", "rollout_stalled", "inference_unreachable", True),
    ("inference_wedged", "rollout_stalled", "inference_wedged", True),
    ("staleness_blocked", "rollout_stalled", "staleness_blocked", False),
    ("workflow_failing", "rollout_stalled", "workflow_failing", False),
    ("weight_sync_stuck", "weight_sync_stuck", None, True),
]


@pytest.mark.slow
@pytest.mark.parametrize(("hang", "category", "cause", "server_named"), CASES)
def test_rollout_hang_is_caught_with_its_cause(
    launcher: Launcher, hang: str, category: str, cause: str | None, server_named: bool
) -> None:
    port = free_port_pair()
    result = launcher.run(
        [*FAST, f"demo.hang={hang}", f"demo.server_port={port}"], config=CONFIG, trial=hang
    )
    assert result.returncode == 3, result.output[-3000:]
    (report,) = result.reports
    assert report["category"] == category, report["summary"]
    assert report["cause"] == cause, report["summary"]
    address = f"127.0.0.1:{port}"
    named = [w["address"] for w in report["culprit_workers"]]
    assert (named == [address]) == server_named, report["culprit_workers"]
    if category == "weight_sync_stuck":
        assert report["culprit_ranks"] == [0]
        assert "update_weights_from_distributed" in report["summary"]
    else:
        assert report["culprit_ranks"] == []
        assert "prepare_batch" in report["summary"]
    if hang == "inference_paused":
        assert f"{address} is paused" in report["summary"]
        evidence = json.loads(Path(report["files"]["evidence"]).read_text())
        chains = [
            [link["name"] for link in task["chain"]]
            for rank in evidence["ranks"]
            for task in rank["tasks"]
            if task["awaiting"] == address
        ]
        assert any(
            c[:4]
            == [
                "WorkflowExecutor._execute_workflow",
                "Workflow.arun_episode",
                "Workflow.agenerate",
                "arequest_with_retry",
            ]
            for c in chains
        ), chains
        assert "## Inference servers" in Path(report["files"]["report_md"]).read_text()


@pytest.mark.parametrize("path", sorted(RECORDED.glob("*.json")), ids=lambda p: p.stem)
def test_recorded_rollout_evidence(path: Path) -> None:
    """Evidence recorded from the real runs above and the real AReaL runs of test_areal.py:
    the file name is the expected cause (``<cause>[--<label>].json``)."""
    verdict = classify(Evidence.from_dict(json.loads(path.read_text())))
    assert (verdict.category, verdict.cause) == ("rollout_stalled", path.stem.split("--")[0])
    assert verdict.culprit_ranks == []


def test_recorded_rollout_causes_are_all_covered() -> None:
    """Every cause of the real runs here has a fixture, and so have workflow_stuck and
    reward_stuck (from the real AReaL runs of test_areal.py and test_areal_accuracy.py)."""
    causes = {p.stem.split("--")[0] for p in RECORDED.glob("*.json")}
    assert causes == {c[2] for c in CASES if c[2]} | {"workflow_stuck", "reward_stuck"}


def test_task_snapshot_names_the_awaited_server_and_the_wait() -> None:
    """A coroutine stuck on a server that accepts and never answers, read from another thread."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    address = f"127.0.0.1:{server.getsockname()[1]}"
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def agenerate(addr: str) -> bytes:
        host, port = addr.split(":")
        reader, _writer = await asyncio.open_connection(host, int(port))
        return await reader.readline()

    future = asyncio.run_coroutine_threadsafe(agenerate(address), loop)
    try:
        clock = TaskClock()
        time.sleep(0.3)
        snapshot(clock)
        time.sleep(0.5)
        dump = snapshot(clock)
        (task,) = [t for t in dump["tasks"] if t["chain"][0]["name"].endswith("agenerate")]
        assert task["awaiting"] == address
        assert task["chain"][-1]["name"] == "StreamReader._wait_for_data"
        assert task["pending_s"] >= 0.4
    finally:
        future.cancel()
        loop.call_soon_threadsafe(loop.stop)
        server.close()


def test_probe_reads_a_paused_server_without_changing_it() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(STANDIN), "--port", str(port)])
    try:
        address = f"127.0.0.1:{port}"
        for _ in range(100):
            if probe(address, 0.5)["state"] == "up":
                break
            time.sleep(0.05)
        assert probe(address, 0.5)["paused"] is False
        import urllib.request

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        opener.open(urllib.request.Request(f"http://{address}/pause_generation", b"{}"), timeout=2)
        first, second = probe(address, 0.5), probe(address, 0.5)
        assert first["state"] == second["state"] == "up"
        assert first["paused"] is second["paused"] is True
    finally:
        proc.kill()
        proc.wait()
    gone = probe(address, 0.5)
    assert gone["state"] == "unreachable"


def test_areal_s_vllm_pause_gate_is_read_from_an_idle_engine_the_job_awaits() -> None:
    """AReaL's areal_vllm_server holds requests at its HTTP gate, before the engine, and no
    endpoint says so: the real vLLM evidence without vLLM's own pause flag still reads as
    paused, with the gate named; a vLLM nobody awaits is not."""
    data = json.loads((RECORDED / "inference_paused--real-vllm.json").read_text())
    for server in data["servers"]:
        server.pop("paused", None)
    verdict = classify(Evidence.from_dict(data))
    assert (verdict.category, verdict.cause) == ("rollout_stalled", "inference_paused")
    assert "AReaL's vLLM pause gate" in verdict.summary and verdict.confidence == 0.7
    for process in data["ranks"] + data["workers"]:
        process["tasks"] = []
    assert classify(Evidence.from_dict(data)).cause != "inference_paused"


def test_a_single_controller_report_lists_only_the_inference_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real AReaL 1.0 single-controller hang: the controller awaits its actors' RPC servers
    (up, no engine) beside the SGLang stand-in. Gathered again from the recorded probes and task
    dumps, report.md lists the stand-in alone under "Inference servers"."""
    recorded = EVIDENCE / "straggler_w2_r0--areal-fsdp2-all-gather.json"
    evidence = Evidence.from_dict(json.loads(recorded.read_text()))
    probes = {s["address"]: s for s in evidence.servers}
    assert len(probes) == 3  # as recorded before: the two actors' RPC ports listed as servers
    dumps = {p.pid: {"tasks": p.tasks} for p in evidence.processes()}
    monkeypatch.setattr(rollout, "collect", lambda *_: dumps)
    monkeypatch.setattr(rollout, "probe_all", lambda addresses, _t: [probes[a] for a in addresses])
    running = [w.address for w in evidence.workers if w.role == "inference_server"]
    _, evidence.servers = rollout.gather_rollout(RunLayout(tmp_path), [], running, 5.0)

    ctx = IncidentContext("local", "rid", str(tmp_path), 2, ["vm"], "exp", "t")
    report = build_report("20261122T000000Z-straggler-abcd", classify(evidence), evidence, ctx)
    incident = write_incident(tmp_path, report, evidence, Redactor())
    markdown = (incident / "report.md").read_text()
    section = markdown.split("## Inference servers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| 127.")]
    assert [row.split(" | ")[0] for row in rows] == ["| 127.0.0.1:32735"], section
