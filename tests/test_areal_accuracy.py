"""What real AReaL hangs must be called, on the CPU harness (``tests/test_areal.py``): an early
exit from the training loop on one rank, a controller exception, a reward function that never
returns, a slow phase that would have recovered, a dead inference server, and the one staleness
trap the preflight refuses, run to show that it hangs (and a small capacity it no longer
refuses, to show that it trains)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from recording import record_evidence
from test_areal import CANCEL_AFTER, make_harness, needs_areal, needs_root, run_areal

from testkit.launcher import Launcher
from testkit.reports import suspected_looks

pytestmark = [needs_areal, needs_root, pytest.mark.slow]


def one_release(version: str) -> pytest.MarkDecorator:
    """Each scenario runs on one AReaL release, the releases taking turns, unless
    ``AREAL_WATCHDOG_TEST_BOTH_RELEASES=1``: both releases on every scenario add about ten
    minutes of real runs, which the suite's 40-minute budget has no room for (both releases run
    both modes in ``tests/test_areal.py``)."""
    both = os.environ.get("AREAL_WATCHDOG_TEST_BOTH_RELEASES") == "1"
    releases = ["1.0.4", "2.0.0"] if both else [version]
    return pytest.mark.parametrize("areal", releases, indirect=True)


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One harness per scenario, made once."""
    base = tmp_path_factory.mktemp("accuracy-harness")
    return {
        "raise": make_harness(base / "raise", "--train-raise-from", "2"),
        "plain": make_harness(base / "plain"),
        "no_score": make_harness(base / "no_score", "--no-score-from", "4"),
        "slow_tool": make_harness(base / "slow", "--slow-tool-from", "6", "--slow-tool-count", "2"),
    }


@one_release("2.0.0")
def test_an_early_exit_on_one_rank_is_a_cleanup_deadlock_of_that_rank(
    launcher: Launcher, harnesses: dict[str, Path], areal: str
) -> None:
    """AReaL #684's shape, SPMD on two FSDP ranks: the rank that gets the sample the model
    refuses leaves train() through PPOTrainer.__exit__ -> close -> FSDPEngine.destroy and waits
    in its barrier, while its peer goes on into FSDP's all-gather."""
    result = run_areal(
        launcher, harnesses["raise"], "early", python=areal, overrides=
        ["launch.mode=spmd", "actor.backend=fsdp:d2", "+actor.ppo_n_minibatches=2",
         "total_train_steps=3"],
    )  # fmt: skip
    assert result.returncode == 3, result.output[-4000:]
    (report,) = result.reports
    assert report["category"] == "cleanup_deadlock", report["summary"]
    (culprit,) = report["culprit_ranks"]
    assert "FSDPEngine.destroy" in report["summary"]
    assert "still in ordinary code" not in report["summary"]
    record_evidence(report, f"cleanup_deadlock_w2_r{culprit}--areal-early-exit")


@one_release("1.0.4")
def test_a_controller_exception_is_the_summary(
    launcher: Launcher, harnesses: dict[str, Path], areal: str
) -> None:
    """More PPO minibatches than samples: AReaL's controller raises EngineCallError from
    ppo_update; its teardown then ends the actor worker."""
    result = run_areal(
        launcher,
        harnesses["plain"],
        "ctrl",
        python=areal,
        overrides=["+actor.ppo_n_minibatches=8", "total_train_steps=2"],
    )
    assert result.returncode == 1, result.output[-4000:]
    (report,) = result.reports
    assert report["category"] == "rank_crashed" and report["culprit_ranks"] == []
    (culprit,) = report["culprit_workers"]
    assert culprit["role"] == "controller"
    summary = report["summary"]
    assert summary.startswith("The controller failed: raised EngineCallError at ")
    assert "examples/areal/gsm8k_rl.py:" in summary
    assert "'ppo_update'" in summary and "is smaller than min_groups 8" in summary
    record_evidence(report, "rank_crashed_w1_r--areal-controller-exception")


@one_release("2.0.0")
def test_a_reward_function_that_never_returns_is_named_with_its_pool_process(
    launcher: Launcher, harnesses: dict[str, Path], areal: str
) -> None:
    """AReaL runs the reward in a process pool (a child of the rollout worker) with a timeout,
    after which the sample silently scores 0: damage, posted at once as a warning that names
    the reward function, the pool process and what happens to the rewards; the job is not
    cancelled for it (only the hard limit ends a silence that lasts)."""
    result = run_areal(
        launcher, harnesses["no_score"], "reward", python=areal, overrides=
        ["+launch.env.AREAL_EXAMPLE_REWARD_FN=rewards.gsm8k_or_never", CANCEL_AFTER],
    )  # fmt: skip
    assert result.returncode in (0, 3), result.output[-4000:]
    report, *later = result.reports
    assert (report["category"], report["cause"]) == ("rollout_stalled", "reward_stuck")
    assert report["action"] == "report" and report["confirmation"]["warning"] is True
    assert report["summary"].startswith("Warning: the job goes on, but it is silently wrong")
    assert "posting a warning" in result.output
    if result.returncode == 3:  # no step came back: the hard limit, not a look, ended it
        assert later[-1]["confirmation"]["by"] == "hard_limit", later[-1]["summary"]
    (culprit,) = report["culprit_workers"]
    helpers = [w for w in report["workers"] if w["role"] == "helper"]
    assert culprit["role"] == "helper" and culprit["pid"] in {h["pid"] for h in helpers}
    summary = report["summary"]
    assert "wait for the reward function gsm8k_or_never(), stuck at" in summary
    assert "examples/areal/rewards.py:" in summary and "a child of rollout 0" in summary
    assert "rewards are silently falling back to 0" in summary
    record_evidence(report, "reward_stuck--areal-single-controller", "rollout")


@one_release("2.0.0")
def test_a_slow_phase_the_job_has_never_seen_trains_to_the_end_and_pages_nobody(
    launcher: Launcher, harnesses: dict[str, Path], areal: str
) -> None:
    """Steps 1-3 are quick; every episode of step 4 waits 24 s on a tool, twice the 12 s stall
    threshold (``on_hang: cancel``). A slow tool and a dead one have the same stack
    (``workflow_stuck``): the look is written, not posted, and only the hard limit (3
    thresholds) would end the job; the tool answers first and the job trains to the end. (With
    one episode at a time the step would last 48 s, past the hard limit: cancelled, rightly.)"""
    result = run_areal(
        launcher, harnesses["slow_tool"], "slow", python=areal, overrides=
        ["rollout.backend=sglang:d2", "total_train_steps=4", "rollout.max_head_offpolicyness=0",
         "+launch.env.AREAL_EXAMPLE_SLOW_TOOL_S=24"],
    )  # fmt: skip
    assert result.returncode == 0, result.output[-4000:]  # not refused (2), not cancelled (3)
    assert result.reports == []  # nothing posted
    looks = suspected_looks(result.run_dir)  # later looks may catch the weight update
    assert looks and looks[0]["cause"] == "workflow_stuck", result.output[-3000:]
    assert not any(r["confirmation"]["posted"] for r in looks)
    assert looks[0]["last_step"] == 3 and looks[0]["confirmation"]["cancel_after_s"] >= 60
    assert "no stack tells a slow phase from a hang here" in result.output
    assert "job completed (last step 4); 0 incident(s), " in result.output


@one_release("2.0.0")
def test_a_silent_checkpoint_save_at_the_shipped_defaults_pages_nobody(
    launcher: Launcher, harnesses: dict[str, Path], areal: str
) -> None:
    """The save of global step 4 writes 90 MB in fsync'd chunks for 45 s with no log line (the
    example's ``AREAL_EXAMPLE_SILENT_SAVE``), at the shipped threshold (``auto``, learned from
    the steps before it): the look finds the controller's stack where it was but its own
    counters writing, busy, not hung; the job trains to the end."""
    result = run_areal(
        launcher, harnesses["plain"], "save", python=areal, overrides=
        ["total_train_steps=6", "watchdog.stall_timeout=auto", "watchdog.poll_interval=1",
         "+launch.env.AREAL_EXAMPLE_SILENT_SAVE=4:90:45"],
    )  # fmt: skip
    assert result.returncode == 0, result.output[-4000:]
    assert result.reports == []
    looks = suspected_looks(result.run_dir)
    assert looks, f"no look at the save: the test proves nothing\n{result.output[-3000:]}"
    assert "read or wrote" in looks[0]["summary"], looks[0]["summary"]
    assert "job completed (last step 6); 0 incident(s)" in result.output


@one_release("1.0.4")
def test_a_dead_inference_server_is_confirmed_at_the_first_look_and_the_job_cancelled(
    launcher: Launcher, harnesses: dict[str, Path], areal: str
) -> None:
    """The inference server is SIGKILLed after step 1, in step 2's rollout; AReaL's rollout worker
    resubmits its episodes against it forever (each fails by exception: churn, not movement).
    A server that refuses connections is conclusive: the server pulse sees it within 5 s and
    opens a look at once (trigger ``server_refused``, not the warm-up's 60 s floor, before
    AReaL's own update_weights fails), no second look, the job is cancelled well within the
    hard limit, and the report names the server."""
    result = run_areal(
        launcher, harnesses["plain"], "dead", python=areal, overrides=
        ["total_train_steps=3", "+launch.env.AREAL_STANDIN_DIE_AFTER_UPDATE=1"],
    )  # fmt: skip
    assert result.returncode == 3, result.output[-4000:]
    (report,) = result.reports
    assert (report["category"], report["cause"]) == ("rollout_stalled", "inference_unreachable")
    assert report["trigger"] == "server_refused" and "EngineCallError" not in result.output
    confirmation = report["confirmation"]
    assert (confirmation["by"], confirmation["posted"]) == ("evidence", True)
    assert report["stalled_for_s"] < 60 <= confirmation["cancel_after_s"]
    assert "a second look" not in result.output
    (server,) = [w for w in report["culprit_workers"] if w["role"] == "inference_server"]
    assert server["address"] in report["summary"] and "refuses connections" in report["summary"]
    assert suspected_looks(result.run_dir) == []
    record_evidence(report, "inference_unreachable--areal-dead-server", "rollout")


@one_release("1.0.4")
def test_the_staleness_trap_the_preflight_refuses_really_hangs(
    launcher: Launcher, harnesses: dict[str, Path], areal: str
) -> None:
    """A negative max_head_offpolicyness: refused (one line, the fix); launched anyway, no
    rollout ever starts and the watchdog calls it staleness_blocked."""
    trap = ["rollout.max_head_offpolicyness=-1", "watchdog.startup_timeout=100"]
    refused = run_areal(launcher, harnesses["plain"], "stale", python=areal, overrides=trap)
    assert refused.returncode == 2, refused.output[-2000:]
    assert "rollout.max_head_offpolicyness: -1 is negative" in refused.output
    result = run_areal(
        launcher, harnesses["plain"], "stale", python=areal, overrides=[*trap, "--ignore-preflight"]
    )
    assert result.returncode == 3, result.output[-4000:]
    (report,) = result.reports
    assert (report["category"], report["cause"]) == ("rollout_stalled", "staleness_blocked")
    record_evidence(report, "staleness_blocked--areal-negative-offpolicyness", "rollout")
