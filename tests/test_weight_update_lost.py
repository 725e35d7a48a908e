"""A weight update that one inference server never completes is ``weight_sync_stuck``, naming
that server and the worker waiting on it, not a rank in a "point-to-point send" (the actor's
HTTP callback thread sits in requests' ``HTTPAdapter.send``).

Recorded from real AReaL runs (``tests/test_areal.py``: two stand-in SGLang servers, one of
which never answers its third ``/update_weights_from_disk``, ``AREAL_STANDIN_HOLD_UPDATE_AFTER``)
and derived from them for AReaL's vLLM client and its distributed path (``as_vllm``)."""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from areal_watchdog.diagnose.classify import classify
from areal_watchdog.evidence.model import Evidence, Frame, RankEvidence, ThreadStack

DATA = Path(__file__).parent / "data" / "evidence"
STANDIN = Path(__file__).parents[1] / "examples" / "inference_server" / "sglang_standin.py"
TORCH = "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
# fixture: (the server that never answered, as its stand-in claimed it; its rollout worker)
RECORDED = {
    "weight_sync_stuck_w1_r--areal-lost-disk-update": ("127.0.0.1:15681", 1),  # AReaL 1.0.4
    "weight_sync_stuck_w1_r--areal2-lost-disk-update": ("127.0.0.1:15681", 1),  # AReaL 2.0.0
}


def load(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text())


def culprits(verdict: Any) -> set[tuple[str, object]]:
    return {(w["role"], w.get("address") or w.get("index")) for w in verdict.culprit_workers}


@pytest.mark.parametrize("name", RECORDED)
def test_a_lost_disk_update_names_the_server_and_its_rollout_worker(name: str) -> None:
    held, rollout = RECORDED[name]
    verdict = classify(Evidence.from_dict(load(name)))
    assert verdict.category == "weight_sync_stuck", verdict.summary
    assert verdict.culprit_ranks == []
    assert culprits(verdict) == {("inference_server", held), ("rollout", rollout)}
    assert verdict.summary.startswith(
        f"A weight update never completed on the inference server {held} (pid "
    ), verdict.summary
    assert f"rollout {rollout} (pid" in verdict.summary
    assert "_update_weights_from_disk() at site-packages/areal/infra/remote_inf_engine.py" in (
        verdict.summary
    )
    assert "the controller (pid" in verdict.summary and "TrainController.update_weights()" in (
        verdict.summary
    )
    assert verdict.activities[0].kind != "p2p" and "point-to-point" not in verdict.summary


def as_vllm(data: dict[str, Any], path: str) -> dict[str, Any]:
    """The same job on AReaL's vLLM client, derived, not recorded (no vLLM build of AReaL's
    server runs here: docs/vllm.md). AReaL's client helpers are the same functions on both
    backends (``RemoteInfEngine``'s ``_update_weights_from_disk`` posting ``/areal_update_weights``,
    ``_update_weights_from_distributed`` posting ``/areal_set_update_weight_meta`` then
    ``/areal_update_weights_xccl``: ``areal/engine/vllm_remote.py`` in 1.0.4 and 2.0.0); AReaL's
    vLLM server answers them in async routes (``areal_update_weight``), on no thread's stack, so
    only the client's pending request names the server. vLLM's probes carry no pause flag. On the
    distributed path the actor broadcasts the weights (torch.distributed's ``broadcast``)."""
    data = copy.deepcopy(data)
    for server in data["servers"]:
        if server.get("engine"):
            server["engine"] = "vllm"
            server.pop("paused", None)
    for process in data["ranks"] + data["workers"]:
        if process.get("role") == "inference_server":
            process["threads"] = [t for t in process["threads"] if not _in_update(t["frames"])]
        for link in _links(process):
            link["name"] = link["name"].replace("_from_disk", f"_from_{path}")
    if path == "distributed":
        engine = next(t for t in data["ranks"][0]["threads"] if t["name"] == "EngineWorker")
        engine["frames"].insert(0, {"name": "broadcast", "filename": TORCH, "line": 2800})
    return data


def _in_update(frames: list[dict[str, Any]]) -> bool:
    return any("update_weights" in f["name"] for f in frames)


def _links(process: dict[str, Any]) -> list[dict[str, Any]]:
    frames = [f for t in process["threads"] for f in t["frames"]]
    return frames + [link for task in process.get("tasks", []) for link in task["chain"]]


@pytest.mark.parametrize("path", ["disk", "distributed"])
def test_a_lost_update_on_areals_vllm_client_names_the_server_from_the_pending_request(
    path: str,
) -> None:
    name = "weight_sync_stuck_w1_r--areal-lost-disk-update"
    held, rollout = RECORDED[name]
    verdict = classify(Evidence.from_dict(as_vllm(load(name), path)))
    assert verdict.category == "weight_sync_stuck", verdict.summary
    assert culprits(verdict) == {("inference_server", held), ("rollout", rollout)}
    assert f"rollout {rollout} (pid" in verdict.summary
    assert f"_update_weights_from_{path}() at" in verdict.summary
    assert "update handler" not in verdict.summary  # no server stack says so: the request does
    # the actor: in torch.distributed's broadcast on the distributed path, in no p2p op on disk's
    expected = {"collective"} if path == "distributed" else {"idle", "blocked", "running"}
    assert verdict.activities[0].kind in expected, verdict.activities[0]


def test_a_users_own_update_weights_in_a_ddp_job_is_no_weight_transfer() -> None:
    """Only AReaL's bare ``update_weights`` counts: a DDP job's is judged by its collectives."""
    user = "/home/me/train.py"

    def rank(r: int, line: int) -> RankEvidence:
        frames = [Frame("all_reduce", TORCH, 100), Frame("update_weights", user, line)]
        return RankEvidence(r, pid=100 + r, state="blocked", evidence_method="py-spy",
                            threads=[ThreadStack("MainThread", frames)])  # fmt: skip

    verdict = classify(Evidence(3, [rank(0, 10), rank(1, 10), rank(2, 20)]))
    assert (verdict.category, verdict.culprit_ranks) == ("collective_mismatch", [2])


def post(address: str, path: str, timeout: float) -> bool:
    """True when the server answered within ``timeout``."""
    request = urllib.request.Request(f"http://{address}{path}", b'{"model_path": "m"}')
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return True
    except TimeoutError:
        return False


def start_standin(servers: list[subprocess.Popen], *args: str) -> str:
    """One stand-in SGLang server on 127.0.0.1 (kept in ``servers``, for the caller to kill),
    once it serves; its address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, str(STANDIN), "--port", str(port), *args]
    servers.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
    assert servers[-1].stdout is not None and "serving" in servers[-1].stdout.readline()
    return f"127.0.0.1:{port}"


def test_the_standins_fault_holds_one_servers_update_and_says_which(tmp_path: Path) -> None:
    claim = tmp_path / "held"
    servers: list[subprocess.Popen] = []
    try:
        fault = ("--hold-update-after", "1", "--hold-update-claim", str(claim))
        addresses = [start_standin(servers, *fault) for _ in range(2)]
        assert all(post(a, "/update_weights_from_disk", 5) for a in addresses)  # the first: kept
        answered = {a: post(a, "/update_weights_from_disk", 1) for a in addresses}
        assert answered == {a: a != claim.read_text() for a in addresses}
        assert all(post(a, "/pause_generation", 5) for a in addresses)  # the rest still answers
    finally:
        for server in servers:
            server.kill()
            server.wait()


def test_the_standins_wedge_holds_generation_and_probes_but_answers_pause_and_updates() -> None:
    """The wedged server the AReaL tests use: after its N-th generate request nothing generates
    and /health goes unanswered, while pause, weight updates and continue still answer, so the
    trainer ends waiting for rollouts after the steps it has them for, whenever the wedge fell
    in its step (CI once saw a wedge mid-step hold the step's pause, and with it its step line)."""
    servers: list[subprocess.Popen] = []
    try:
        address = start_standin(servers, "--wedge-after", "1")
        assert post(address, "/generate", 5)
        assert not post(address, "/generate", 1)
        with pytest.raises(TimeoutError):
            urllib.request.urlopen(f"http://{address}/health", timeout=1)
        control = ("/pause_generation", "/update_weights_from_disk", "/continue_generation")
        assert [post(address, path, 5) for path in control] == [True, True, True]
        assert not post(address, "/generate", 1)
    finally:
        for server in servers:
            server.kill()
            server.wait()
