"""``areal-launch check-workflow`` without a server: the staleness gate's arithmetic and words,
the stages' bookkeeping on real coroutines (an episode that never ends, a loop held by
synchronous code), the table of the four real checks recorded by ``tests/test_check_workflow.py``
(``tests/data/workflow_check``), the vLLM it would start, and bad input in one line."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from areal_watchdog.cli import main
from areal_watchdog.config.load import load_config
from areal_watchdog.trajectory.rollout_consistency.greedy import GreedyPair
from areal_watchdog.workflow_check.model import CheckResult, StageResult
from areal_watchdog.workflow_check.probe import rewards_called
from areal_watchdog.workflow_check.render import render
from areal_watchdog.workflow_check.server import vllm_command
from areal_watchdog.workflow_check.stages import run_on_own_loop, summarise
from areal_watchdog.workflow_check.staleness import Staleness

DATA = Path(__file__).resolve().parents[1] / "data" / "workflow_check"
REPO = Path(__file__).resolve().parents[2]


def recorded(name: str) -> str:
    result = CheckResult.from_dict(json.loads((DATA / f"{name}.json").read_text()))
    return render(result, "127.0.0.1:8000, --server (OpenAI API)")


def test_the_gate_is_open_when_a_worker_may_start_its_share_before_the_first_update() -> None:
    gate = Staleness(8, 4, 2, 8, 0, None)  # batch 8 over 2 workers: 4 each, (0+1) x 4 allowed
    assert (gate.allowed, gate.share, gate.trapped) == (4, 4, False)
    assert gate.sentence().endswith("(train_dataset.batch_size 8 over 2): no trap")


def test_a_consumer_batch_smaller_than_the_batch_shuts_the_gate_with_its_numbers() -> None:
    gate = Staleness(2, 2, 1, 1, 0, 4)
    assert gate.trapped and gate.at_once == 1
    assert "start (0 + 0 + 1) x 1 = 1 group before the weights' version moves" in gate.sentence()
    assert "so the other 1 waits for the staleness gate forever" in gate.sentence()


def test_a_negative_offpolicyness_starts_nothing() -> None:
    gate = Staleness(4, 1, 1, 4, -1, None)
    assert gate.allowed == 0 and "so no episode ever starts" in gate.sentence()


def test_max_concurrent_rollouts_over_many_workers_only_delays() -> None:
    gate = Staleness(8, 1, 4, 8, 1, 1)  # 1 // 4 workers: AReaL clamps it to 1 each
    assert not gate.trapped and gate.at_once == 1


def test_episodes_that_end_never_and_a_loop_held_by_sync_code_are_told_apart() -> None:
    async def answers() -> str:
        await asyncio.sleep(0.01)
        return "ok"

    async def waits_for_a_tool() -> None:
        await asyncio.Event().wait()

    episodes, wall, thread = run_on_own_loop(
        [("row 0", answers), ("row 1", waits_for_a_tool)], 2, 0.5
    )
    stage = summarise("one batch", "2 rows", 2, episodes, wall, 0.5, thread)
    assert (stage.done, stage.pending, stage.not_started, stage.blocked_loop) == (1, 1, 0, [])
    (pending,) = stage.pending_episodes
    assert pending["episode"] == "row 1"
    assert [link["name"] for link in pending["chain"]][:1] == [
        "test_episodes_that_end_never_and_a_loop_held_by_sync_code_are_told_apart.<locals>."
        "waits_for_a_tool"
    ]

    async def blocks_the_loop() -> None:
        time.sleep(3)  # a tool called without await

    episodes, wall, thread = run_on_own_loop([("row 0", blocks_the_loop)], 1, 0.3)
    stage = summarise("one episode", "row 0", 1, episodes, wall, 0.3, thread)
    assert stage.pending == 1 and not stage.passed
    assert stage.blocked_loop[-1]["name"].endswith("<locals>.blocks_the_loop")


class Tool:
    """A tool whose call is synchronous: awaited nowhere, it holds the loop while it runs."""

    def call(self) -> None:
        time.sleep(3)


def test_a_loop_held_by_one_episode_is_the_stages_cause_named_with_qualified_frames() -> None:
    async def asks_the_server() -> None:
        await asyncio.sleep(30)  # an answer that can only arrive once the loop runs again

    async def runs_the_tool() -> None:
        await asyncio.sleep(0.05)  # the others are suspended by then
        Tool().call()

    jobs = [(f"row {i}", asks_the_server) for i in range(3)] + [("row 3", runs_the_tool)]
    episodes, wall, thread = run_on_own_loop(jobs, 4, 0.5)
    stage = summarise("one batch", "4 rows", 4, episodes, wall, 0.5, thread)
    text = render(CheckResult(workflow="w", stages=[stage]), "127.0.0.1:1")
    lines = text.splitlines()
    held = next(i for i, line in enumerate(lines) if "the event loop is blocked" in line)
    assert lines[held].startswith("one batch: the event loop is blocked by row 3 in synchronous "
                                  "code at Tool.call (test_unit_workflow_check.py:")  # fmt: skip
    assert "runs_the_tool (test_unit_workflow_check.py:" in lines[held + 1]
    assert lines[held + 1].split(" > ")[-1].startswith("Tool.call (")  # qualified, innermost last
    others = [line for line in lines if line.startswith("  row ")]
    assert len(others) == 3 and "row 3" not in " ".join(others)
    assert all("cannot resume while the loop is blocked" in line for line in others)
    assert "3 other episodes pending" in text and "no frame" not in text
    assert lines[-1].startswith(
        "failed at stage 1 (one batch): the event loop is blocked by row 3 in synchronous code "
        "at Tool.call (test_unit_workflow_check.py:"
    )
    assert "); 4 pending of 4 episodes; not run: " in lines[-1]


def own_reward(*_args: object, **_kwargs: object) -> float:
    """A reward a workflow wraps itself (picklable: AReaL runs it in a process pool)."""
    return 1.0


def test_the_reward_line_says_what_the_workflow_called_not_what_the_script_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reward_api = pytest.importorskip("areal.api.reward_api")
    wrapper_class = reward_api.AsyncRewardWrapper
    monkeypatch.setattr(wrapper_class, "__call__", wrapper_class.__call__)  # restored after
    called = rewards_called()
    assert asyncio.run(wrapper_class(own_reward, max_workers=1)("p", "c", [1], [2], "a")) == 1.0
    stage = StageResult("one episode", "row 0", 1, done=1)
    named = "areal.reward.gsm8k.gsm8k_reward_fn"
    line = render(CheckResult("w.Flow", named, called, stages=[stage]), "s").splitlines()[0]
    assert line == (
        "workflow: w.Flow, reward test_unit_workflow_check.own_reward "
        f"(workflow_kwargs named {named})"
    )
    unseen = render(CheckResult("w.Flow", named, [], stages=[stage]), "s").splitlines()[0]
    assert unseen == (
        f"workflow: w.Flow, reward: could not tell (workflow_kwargs named {named}, but no "
        "episode called AReaL's AsyncRewardWrapper)"
    )
    same = render(CheckResult("w.Flow", named, [named], stages=[stage]), "s").splitlines()[0]
    assert same == f"workflow: w.Flow, reward {named}"


def test_the_healthy_check_passes_every_stage() -> None:
    text = recorded("healthy")
    assert "workflow: tool_workflow.ToolRLVRWorkflow, reward areal.reward.gsm8k" in text
    assert text.endswith("passed: 3 stages, every episode ended")
    assert "(1 + 0 + 1) x 2 = 4 groups before the weights' version moves" in text


def test_the_pool_deadlock_shows_each_pending_episode_at_the_semaphore() -> None:
    text = recorded("pool_deadlock")
    chains = [line for line in text.splitlines() if line.startswith("  row ")]
    assert len(chains) == 3
    assert all("SessionPool.session (agent_workflow.py:" in c for c in chains)
    assert all(c.endswith(")") and "Semaphore.acquire (locks.py:" in c for c in chains)
    assert text.splitlines()[-1].startswith("failed at stage 2 (one batch): 3 pending of 4")


def test_the_tool_that_never_returns_stops_the_check_at_the_first_episode() -> None:
    text = recorded("tool_never_returns")
    assert "run_tool (tool_workflow.py:" in text
    assert text.splitlines()[-1] == (
        "failed at stage 1 (one episode): 1 pending of 1 episode; not run: one batch, AReaL "
        "engine (fix this stage first)"
    )


def test_the_staleness_trap_says_why_episodes_never_started() -> None:
    text = recorded("staleness_trap")
    assert "AReaL engine: 2 episodes never started: the staleness gate above holds them" in text
    assert "the other 1 waits for the staleness gate forever" in text


def test_the_vllm_it_starts_serves_the_actor_on_loopback_with_the_configs_flags(
    tmp_path: Path,
) -> None:
    config_file = tmp_path / "job.yaml"
    config_file.write_text(
        f"experiment_name: e\ntrial_name: t\ncluster: {{fileroot: {tmp_path}/runs}}\n"
        "actor: {path: /models/q, dtype: bfloat16}\nsglang: {context_length: 4096}\n"
        "vllm: {gpu_memory_utilization: 0.8, enforce_eager: true}\nrollout: {}\n"
        "launch: {entrypoint: train.py}\n"
    )
    argv = vllm_command(load_config(str(config_file)), "/venv/bin/python", 8011, ["--seed=3"])
    assert argv == [
        "/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/q",
        "--host", "127.0.0.1", "--port", "8011", "--dtype=bfloat16", "--max-model-len=4096",
        "--gpu-memory-utilization=0.8", "--enforce-eager", "--seed=3",
    ]  # fmt: skip


def test_greedy_pairs_say_where_they_part() -> None:
    assert GreedyPair([1], [5, 6, 7], [5, 6, 7]).parts_at is None
    assert GreedyPair([1], [5, 6, 7], [5, 9, 7]).parts_at == 1
    assert GreedyPair([1], [5, 6], [5, 6, 7]).parts_at == 2


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["check-workflow", "{config}", "--timeout", "0"], "--timeout 0: give a number of seconds"),
        (["check-workflow", "{config}"], "`rollout`: no AReaL rollout section: check-workflow"),
        (["check-consistency", "/nowhere", "--generate", "2"], "--generate N and --server"),
    ],
)
def test_bad_input_is_one_line(
    argv: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "job.yaml"
    config.write_text("experiment_name: e\ntrial_name: t\nlaunch: {entrypoint: train.py}\n")
    code = main([a.replace("{config}", str(config)) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and said in err, err
