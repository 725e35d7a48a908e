"""Preflight: AReaL config traps that hang later are found before launch, each with its fix."""

from __future__ import annotations

import copy

import pytest

from areal_watchdog.config.areal_side.preflight import preflight

# The parts of AReaL's own examples/math/gsm8k_grpo.yaml (1.0) that preflight reads.
GSM8K = {
    "cluster": {"n_nodes": 1, "n_gpus_per_node": 8},
    "rollout": {
        "backend": "sglang:d4p1t1",
        "max_concurrent_rollouts": 256,
        "consumer_batch_size": 256,
        "max_head_offpolicyness": 2,
    },
    "actor": {"backend": "fsdp:d4p1t1"},
}


def config(**changes: object) -> dict:
    tree = copy.deepcopy(GSM8K)
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        tree[section][key] = value
    return tree


def test_areal_example_config_has_no_trap() -> None:
    assert preflight(GSM8K, watchdog=True, stall_threshold="600 s") == []


@pytest.mark.parametrize("areal", ["1.0.4", "2.0.0"])
def test_a_small_capacity_shared_by_many_workers_is_no_trap(areal: str) -> None:
    """Both releases give each rollout worker at least 1 (workflow_executor.py): 2 concurrent
    rollouts among 4 workers trains (tests/test_areal.py runs 1 among 2)."""
    tree = config(rollout__max_concurrent_rollouts=2, rollout__consumer_batch_size=2)
    assert preflight(tree, watchdog=True, stall_threshold="600 s", areal=areal) == []


@pytest.mark.parametrize("areal", ["1.0.4", "2.0.0"])
def test_a_negative_offpolicyness_is_an_error_with_the_fix(areal: str) -> None:
    tree = config(rollout__max_head_offpolicyness=-1)
    (finding,) = preflight(tree, watchdog=True, stall_threshold="600 s", areal=areal)
    assert (finding.level, finding.key) == ("error", "rollout.max_head_offpolicyness")
    assert "never positive" in finding.message and "use 0 or more" in finding.message


def test_an_unknown_areal_gets_one_warning_and_no_staleness_rule() -> None:
    tree = config(rollout__max_head_offpolicyness=-1)
    (finding,) = preflight(tree, watchdog=True, stall_threshold="600 s", areal="3.1.0")
    assert finding.level == "warning"
    assert "AReaL 3.1.0 is not one areal-watchdog knows (1.0.x, 2.0.x)" in finding.message


def test_more_or_fewer_gpus_than_the_cluster_are_warnings() -> None:
    (more,) = preflight(config(actor__backend="fsdp:d8"), watchdog=True, stall_threshold="1 s")
    assert (more.level, more.key) == ("warning", "rollout.backend + actor.backend")
    assert "12 GPUs" in more.message and "1 x 8 = 8" in more.message
    (fewer,) = preflight(config(actor__backend="fsdp:d2"), watchdog=True, stall_threshold="1 s")
    assert fewer.level == "warning" and "2 stay idle" in fewer.message


def test_without_the_watchdog_the_two_hour_timeout_is_named_with_our_threshold() -> None:
    (finding,) = preflight(GSM8K, watchdog=False, stall_threshold="600 s")
    assert finding.level == "warning"
    assert "7,200 s" in finding.message and "600 s" in finding.message


def test_plain_torchrun_configs_are_not_checked() -> None:
    assert preflight({"cluster": {"n_nodes": 1}}, watchdog=False, stall_threshold="8 s") == []
