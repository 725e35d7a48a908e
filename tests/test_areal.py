"""The real AReaL package (1.0.4) launched by ``areal-launch``, on a CPU, in both of its modes.

What runs for real: AReaL's GRPO trainer (``PPOTrainer``) with its local scheduler, ``rpc_server``
workers, FSDP engine on gloo, ``RemoteSGLangEngine`` client, workflow executor, staleness
manager, disk weight updates, GSM8K reward, and in SPMD mode its own inference-server launcher
(``areal.infra.launcher.sglang_server``) and name_resolve. What stands in: the model (a tiny
Qwen2 made offline) and SGLang (``examples/inference_server``, which AReaL launches itself through
the ``sglang`` names it imports). Every run sits in a loopback-only network namespace
(``scripts/loopback.sh``): AReaL binds ``0.0.0.0`` and advertises ``gethostip()``, which there is
127.0.0.1, so nothing listens beyond loopback.

The hangs come in through AReaL's own extension points: a dataset row whose calculator tool never
returns (``examples/areal/tool_workflow.py``), and an inference server that wedges.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from recording import record_evidence

from areal_watchdog.cli import main
from areal_watchdog.common.roles import Identity, identify
from areal_watchdog.config.areal import parse_allocation
from conftest import REPO, Launcher, LaunchResult

AREAL = REPO / "examples" / "areal"
CONFIG = AREAL / "gsm8k_grpo.yaml"
LOOPBACK = ["bash", str(REPO / "scripts" / "loopback.sh")]
FAST = ["watchdog.stall_timeout=12", "watchdog.poll_interval=0.5"]

needs_areal = pytest.mark.skipif(
    importlib.util.find_spec("areal") is None, reason="the areal package is not installed "
    "(bash scripts/setup.sh --areal)",
)  # fmt: skip
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a loopback-only network namespace needs root and unshare",
)


@pytest.fixture(scope="session")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, tokenizer and GSM8K rows (8-11 poisoned) made once, offline."""
    root = tmp_path_factory.mktemp("areal-harness")
    subprocess.run(
        [sys.executable, str(AREAL / "harness" / "make_tiny.py"), str(root), "--poison-from", "8"],
        check=True,
        capture_output=True,
    )
    return root


def run_areal(launcher: Launcher, harness: Path, trial: str, overrides: list[str]) -> LaunchResult:
    """``areal-launch --watchdog local examples/areal/gsm8k_grpo.yaml`` in a loopback netns."""
    (launcher.root / "harness").symlink_to(harness)
    return launcher.run(
        [*FAST, *overrides], trial=trial, config=CONFIG, timeout=420, prefix=LOOPBACK
    )


def by_role(report: dict) -> dict[str, list[dict]]:
    roles: dict[str, list[dict]] = {}
    for process in report["ranks"] + report["workers"]:
        roles.setdefault(process.get("role", "rank"), []).append(process)
    return roles


@needs_areal
@needs_root
@pytest.mark.slow
def test_single_controller_hang_names_the_rollout_worker(launcher: Launcher, harness: Path) -> None:
    """AReaL 1.0's recommended mode: one controller, workers started by AReaL's scheduler. At
    step 5 the poisoned rows' tool never returns; the controller waits in prepare_batch."""
    result = run_areal(launcher, harness, "sc", [])
    assert result.returncode == 3, result.output[-4000:]
    assert "first step seen: step 1" in result.output
    (report,) = result.reports
    assert report["schema_version"] == 3
    assert (report["category"], report["cause"]) == ("rollout_stalled", "workflow_stuck")
    assert report["last_step"] == 4
    (culprit,) = report["culprit_workers"]
    assert (culprit["role"], culprit["index"]) == ("rollout", 0)
    roles = by_role(report)
    assert culprit["pid"] == roles["rollout"][0]["pid"] and culprit["node"]
    assert "The controller" in report["summary"] and "run_tool() at" in report["summary"]
    assert {"controller", "actor", "rollout", "eval-rollout", "inference_server"} <= set(roles)
    (actor,) = roles["actor"]
    assert (actor["rank"], actor["index"]) == (0, 0)
    (controller,) = roles["controller"]
    assert "prepare_batch" in controller["where"]
    assert all(s["address"].startswith("127.0.0.1:") for s in report["servers"])
    assert "culprit workers rollout 0 (pid" in result.output
    record_evidence(report, "workflow_stuck--areal-single-controller", "rollout")


@needs_areal
@needs_root
@pytest.mark.slow
def test_spmd_wedged_server_is_named(launcher: Launcher, harness: Path) -> None:
    """AReaL's SPMD mode: its own server launcher first, name_resolve, then torchrun. The
    inference server stops answering after its 6th request: rank 0 waits for rollouts."""
    result = run_areal(
        launcher, harness, "spmd", ["launch.mode=spmd", "+launch.env.AREAL_STANDIN_WEDGE_AFTER=6"]
    )
    assert result.returncode == 3, result.output[-4000:]
    assert "AREAL_LLM_SERVER_ADDRS=127.0.0.1:" in result.output
    (report,) = result.reports
    assert (report["category"], report["cause"]) == ("rollout_stalled", "inference_wedged")
    (culprit,) = report["culprit_workers"]
    roles = by_role(report)
    (server,) = roles["inference_server"]
    assert culprit["role"] == "inference_server" and culprit["pid"] == server["pid"]
    assert culprit["address"] == server["address"] and server["address"].startswith("127.0.0.1:")
    assert report["ranks"][0]["rank"] == 0 and "inference_launcher" in roles
    assert report["summary"].startswith("Rank 0 is waiting for rollouts in prepare_batch()")
    record_evidence(report, "inference_wedged--areal-spmd", "rollout")


def test_roles_come_from_the_command_line() -> None:
    """AReaL's worker gets its RANK over HTTP later: its command line is what names it."""
    config = "/run/watchdog/job_config.yaml"
    rpc = ["python3", "-m", "areal.infra.rpc.rpc_server", "--port", "1", "--role", "rollout",
           "--worker-index", "2"]  # fmt: skip
    assert identify(rpc, {}, config) == Identity("rollout", 2)
    slurm = ["python", "-m", "areal.infra.rpc.rpc_server", "--role", "actor"]
    assert identify(slurm, {"SLURM_PROCID": "3"}, config) == Identity("actor", 3)
    server = ["python3", "-m", "areal.experimental.inference_service.sglang.launch_server",
              "--host", "127.0.0.1", "--port", "30000"]  # fmt: skip
    assert identify(server, {}, config) == Identity("inference_server", address="127.0.0.1:30000")
    assert identify(["python", "train.py", "--config", config], {}, config) == Identity(
        "controller"
    )
    wrapped = ["python", "-m", "areal_watchdog.rank.main", "train.py", "--config", config]
    assert identify(wrapped, {"RANK": "1"}, config) == Identity("rank", 1)
    assert identify(["python", "-m", "torch.distributed.run", "x.py"], {}, config) == Identity(
        "torchrun"
    )
    spawn = ["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"]
    assert identify(spawn, {}, config) is None
    assert identify(["bash", "-c", "python train.py"], {}, config) is None


def test_allocation_strings() -> None:
    assert parse_allocation("fsdp:d2p1t1").world_size == 2
    assert parse_allocation("sglang:d4t2").world_size == 8
    assert parse_allocation("sglang:d4t2").instance_size == 2
    assert parse_allocation("megatron:(attn:d1p1t2|ffn:d1p1e2)") is None


def test_the_dry_run_shows_each_mode(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """One plan per mode: what the dry run prints is what runs."""
    common = [f"cluster.fileroot={tmp_path}", "--dry-run"]
    assert main(["--watchdog", "local", str(CONFIG), *common]) == 0
    plan = capsys.readouterr().out
    assert "process `controller` (job)" in plan and "gsm8k_rl.py --config" in plan
    assert "AREAL_WATCHDOG_RANK_ROLE=actor" in plan and "rank/sitehook" in plan
    assert "torch.distributed.run" not in plan
    assert main(["--watchdog", "local", str(CONFIG), "launch.mode=spmd", *common]) == 0
    plan = capsys.readouterr().out
    assert "-m areal.infra.launcher.sglang_server" in plan
    assert "starts after: 1 entry in" in plan and "AREAL_LLM_SERVER_ADDRS=<their values>" in plan
    assert "AREAL_SPMD_MODE=1" in plan


def test_a_scheduler_that_contradicts_the_backend_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["local", str(CONFIG), f"cluster.fileroot={tmp_path}", "scheduler.type=ray"])
    assert code == 2
    err = capsys.readouterr().err
    assert "scheduler.type" in err and "'ray'" in err and "Traceback" not in err
