"""Traps in an AReaL config that do not fail at start-up but hang later, found before launch.

Pure: reads the resolved config tree and the installed AReaL's version. Each finding names the
key, says why it hangs and what to change. ``error`` findings stop the launch unless
``--ignore-preflight`` is given; ``warning`` findings are printed and the launch goes on. An
error is only ever a trap seen to hang the AReaL release it is checked for
(``tests/test_areal.py`` runs each one): a preflight must never block a config that works.

- Staleness (per release, ``STALENESS_RULES``): a negative ``max_head_offpolicyness`` leaves
  the staleness capacity ``(offpolicyness + version + 1) x batch`` at 0 before the first
  version, so no rollout ever starts. Both releases clamp each rollout worker's share of
  ``max_concurrent_rollouts`` and ``consumer_batch_size`` to at least 1
  (``workflow_executor.py``: 1.0.4 line 959, 2.0.0 line 1046), so a small value divided among
  many workers (AReaL PR #1396's worry) trains, and is no trap.
- GPUs: the ``rollout.backend`` and ``actor.backend`` allocations (``sglang:d4p1t1`` is
  4 x 1 x 1 GPUs) against ``cluster.n_nodes x cluster.n_gpus_per_node``: a warning either way
  (more cannot be placed; fewer leave GPUs idle), not verified on this project's CPU machines.
- Collective timeout: without ``--watchdog`` a hang holds every GPU until AReaL's 7,200 s
  process-group timeout; with it, the watchdog's stall threshold applies.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from areal_watchdog.common.areal_version import series, unknown_note

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


def preflight(
    tree: dict[str, Any], watchdog: bool, stall_threshold: str, areal: str | None = None
) -> list[Finding]:
    """Every trap found in an AReaL config tree (empty for plain torchrun configs); ``areal``:
    the installed AReaL's version, which picks the staleness rules."""
    findings = []
    rollout = _section(tree, "rollout")
    actor = _section(tree, "actor")
    rollout_dims = _dims(rollout.get("backend"))
    actor_dims = _dims(actor.get("backend"))
    if rollout_dims is not None or actor_dims is not None:
        findings += _gpu_findings(tree, rollout_dims, actor_dims)
    if rollout_dims is not None:
        findings += _staleness_findings(rollout, areal)
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
                "warning",
                where,
                f"ask for {wanted} GPUs but cluster.n_nodes x cluster.n_gpus_per_node is "
                f"{nodes} x {per_node} = {have}: the scheduler cannot place them all; shrink "
                "the allocations or add nodes",
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


def _negative_offpolicyness(rollout: dict[str, Any]) -> Finding | None:
    offpolicy = rollout.get("max_head_offpolicyness")
    if isinstance(offpolicy, bool) or not isinstance(offpolicy, int) or offpolicy >= 0:
        return None
    return Finding(
        "error",
        "rollout.max_head_offpolicyness",
        f"{offpolicy} is negative: the staleness capacity ({offpolicy} + version + 1) x "
        "consumer_batch_size is never positive before the first weight update, so no rollout "
        "starts and prepare_batch waits forever; use 0 or more",
    )


StalenessRule = Callable[[dict[str, Any]], "Finding | None"]
# The rules seen to hang each release (StalenessManager.get_capacity, workflow_executor.py).
STALENESS_RULES: dict[str, tuple[StalenessRule, ...]] = {
    "1.0": (_negative_offpolicyness,),
    "2.0": (_negative_offpolicyness,),
}


def _staleness_findings(rollout: dict[str, Any], areal: str | None) -> list[Finding]:
    rules = STALENESS_RULES.get(series(areal) or "")
    if rules is None:
        note = unknown_note(areal, "its staleness traps are not checked")
        return [Finding("warning", "rollout", note)] if note else []
    return [f for rule in rules if (f := rule(rollout)) is not None]


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
