"""Traps in an AReaL config that do not fail at start-up but hang later, found before launch.

Pure: reads the resolved config tree only. Each finding names the key, says why it hangs and
what to change. ``error`` findings stop the launch unless ``--ignore-preflight`` is given;
``warning`` findings are printed and the launch goes on.

- GPUs: the ``rollout.backend`` and ``actor.backend`` allocations (``sglang:d4p1t1`` is
  4 x 1 x 1 GPUs) must fit ``cluster.n_nodes x cluster.n_gpus_per_node``; more is an error (the
  scheduler waits for GPUs that never come), fewer a warning (idle GPUs).
- Staleness capacity: each rollout worker gets ``max_concurrent_rollouts`` and
  ``consumer_batch_size`` divided by the rollout data-parallel size (AReaL PR #1396); when
  either reaches 0 no rollout can ever start and ``prepare_batch`` waits forever.
- Collective timeout: without ``--watchdog`` a hang holds every GPU until AReaL's 7,200 s
  process-group timeout; with it, the watchdog's stall threshold applies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

AREAL_COLLECTIVE_TIMEOUT_S = 7200
_ALLOCATION = re.compile(r"^(?:(?P<engine>[a-z_]+):)?(?P<dims>(?:[a-z]\d+)+)$")
_DIM = re.compile(r"([a-z])(\d+)")


@dataclass(frozen=True)
class Finding:
    """One trap: ``level`` is error | warning; ``key`` the config key to change."""

    level: str
    key: str
    message: str

    def line(self, source: str) -> str:
        return f"{source}: {self.key}: {self.message}"


def preflight(tree: dict[str, Any], watchdog: bool, stall_threshold: str) -> list[Finding]:
    """Every trap found in an AReaL config tree (empty for plain torchrun configs)."""
    findings = []
    rollout = _section(tree, "rollout")
    actor = _section(tree, "actor")
    rollout_dims = _dims(rollout.get("backend"))
    actor_dims = _dims(actor.get("backend"))
    if rollout_dims is not None or actor_dims is not None:
        findings += _gpu_findings(tree, rollout_dims, actor_dims)
    if rollout_dims is not None:
        findings += _staleness_findings(rollout, rollout_dims.get("d", 1))
    if not watchdog and (rollout or actor):
        findings.append(
            Finding(
                "warning",
                "watchdog",
                f"without --watchdog a hang holds every GPU until AReaL's "
                f"{AREAL_COLLECTIVE_TIMEOUT_S:,} s collective timeout; with --watchdog it is "
                f"reported after {stall_threshold}",
            )
        )
    return findings


def _gpu_findings(
    tree: dict[str, Any], rollout: dict[str, int] | None, actor: dict[str, int] | None
) -> list[Finding]:
    cluster = _section(tree, "cluster")
    nodes, per_node = cluster.get("n_nodes"), cluster.get("n_gpus_per_node")
    if not isinstance(nodes, int) or not isinstance(per_node, int) or per_node <= 0:
        return []
    have = nodes * per_node
    wanted = _gpus(rollout) + _gpus(actor)
    where = "rollout.backend + actor.backend"
    if wanted > have:
        return [
            Finding(
                "error",
                where,
                f"ask for {wanted} GPUs but cluster.n_nodes x cluster.n_gpus_per_node is "
                f"{nodes} x {per_node} = {have}: the scheduler would wait for GPUs that never "
                "come; shrink the allocations or add nodes",
            )
        ]
    if wanted < have:
        return [
            Finding(
                "warning",
                where,
                f"use {wanted} of the {have} GPUs of cluster.n_nodes x cluster.n_gpus_per_node; "
                f"{have - wanted} stay idle",
            )
        ]
    return []


def _staleness_findings(rollout: dict[str, Any], dp: int) -> list[Finding]:
    findings = []
    for key in ("max_concurrent_rollouts", "consumer_batch_size"):
        value = rollout.get(key)
        if isinstance(value, int) and value // dp == 0:
            findings.append(
                Finding(
                    "error",
                    f"rollout.{key}",
                    f"{value} divided among {dp} rollout workers (rollout.backend's data "
                    f"parallel size) leaves each worker 0: no rollout can start and "
                    f"prepare_batch waits forever (AReaL PR #1396); set it to at least {dp}",
                )
            )
    offpolicy = rollout.get("max_head_offpolicyness")
    if isinstance(offpolicy, int) and offpolicy < 0:
        findings.append(
            Finding(
                "error",
                "rollout.max_head_offpolicyness",
                f"{offpolicy} is negative: the staleness capacity is never positive; use 0 or more",
            )
        )
    return findings


def _dims(backend: Any) -> dict[str, int] | None:
    """``"sglang:d4p1t1"`` -> ``{"d": 4, "p": 1, "t": 1}``; None when not an allocation."""
    if not isinstance(backend, str):
        return None
    match = _ALLOCATION.match(backend.strip().lower())
    if match is None:
        return None
    return {k: int(v) for k, v in _DIM.findall(match.group("dims"))}


def _gpus(dims: dict[str, int] | None) -> int:
    """GPUs of an allocation: the product of its dimensions (expert parallelism, ``e``, reuses
    the data- and tensor-parallel GPUs)."""
    if not dims:
        return 0
    total = 1
    for name, value in dims.items():
        total *= 1 if name == "e" else value
    return total


def _section(tree: dict[str, Any], key: str) -> dict[str, Any]:
    value = tree.get(key)
    return value if isinstance(value, dict) else {}
