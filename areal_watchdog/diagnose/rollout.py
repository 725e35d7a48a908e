"""Hangs on the rollout side of RL training: the trainer waits for rollouts, or for a weight
transfer to the inference servers. Pure: reads stacks, task dumps, server probes and log tails.

Rules, in order (docs/hang-categories.md):

1. ``weight_sync_stuck``: a rank is inside a trainer-to-inference weight transfer
   (``update_weights_from_distributed``, ``init_weights_update_group``, ...) and blocked, while
   the inference side is not transferring (AReaL #1439: the server never entered recv).
2. ``rollout_stalled``: a rank waits for rollouts (``prepare_batch``, ``wait_results``,
   ``active_submit_and_wait``, a capacity wait); the ``cause`` comes from the evidence:
   ``inference_unreachable`` (a server refuses connections), ``inference_wedged`` (a server
   accepts but does not answer its health check), ``inference_paused`` (a server reports itself
   paused, or holds queued requests with none running while the job's tasks await it),
   ``staleness_blocked`` (a capacity wait with no rollout in flight: nothing will ever free
   capacity), ``workflow_failing`` (episodes keep being rejected), or ``unknown``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from areal_watchdog.common.rankset import ranks_phrase
from areal_watchdog.evidence.model import BLOCKED, RUNNING, Evidence, Frame, RankEvidence

ROLLOUT_WAITS = frozenset(
    {
        "prepare_batch",
        "rollout_batch",
        "wait_results",
        "active_submit_and_wait",
        "wait_for_capacity",
    }
)
_WEIGHT_SYNC = re.compile(
    r"update_weights?_from_distributed|init_weights?_update_group|update_weights?_from_tensor|"
    r"broadcast_weights|_update_bucket_weights|upload_weights",
    re.I,
)
EPISODE_CALLS = frozenset(
    {"_execute_workflow", "arun_episode", "agenerate", "arequest_with_retry", "generate"}
)
_CAPACITY = re.compile(r"capacity|staleness", re.I)
_REJECTED = re.compile(r"rejected|episode failed|workflow.*(failed|error)", re.I)
REJECTIONS_FOR_FAILING = 3  # rejection lines in one rank's log tail that mean "every episode"


@dataclass
class RolloutFinding:
    """What the rollout rules concluded; the classifier turns it into its Verdict."""

    category: str
    cause: str | None
    confidence: float
    culprit_ranks: list[int]
    summary: str
    culprit_workers: list[dict[str, Any]] = field(default_factory=list)


def rollout_finding(evidence: Evidence) -> RolloutFinding | None:
    """A finding when the job waits on its rollout side or on a weight transfer, else None."""
    live = [r for r in evidence.ranks if r.state in (BLOCKED, RUNNING)]
    syncing = {r.rank: f for r in live if (f := _first(r, lambda f: _WEIGHT_SYNC.search(f.name)))}
    if syncing:
        return _weight_sync(evidence, syncing)
    waiting = {r.rank: f for r in live if (f := _first(r, lambda f: _bare(f) in ROLLOUT_WAITS))}
    if not waiting:
        return None
    return _rollout_stalled(evidence, waiting)


def _weight_sync(evidence: Evidence, syncing: dict[int, Frame]) -> RolloutFinding:
    ranks = sorted(syncing)
    frame = syncing[ranks[0]]
    idle = [s for s in evidence.servers if s.get("state") == "up" and not s.get("running")]
    others = sorted(r.rank for r in evidence.ranks if r.rank not in syncing)
    side = (
        f"the inference server(s) {_addresses(idle)} are up and idle: they never entered the "
        "receiving side of the transfer"
        if idle
        else "the inference side is not transferring"
    )
    verb = "waits" if len(others) == 1 else "wait"
    rest = f"; {ranks_phrase(others)} {verb} for {_them(ranks)}" if others else ""
    return RolloutFinding(
        "weight_sync_stuck",
        None,
        0.85 if idle else 0.7,
        ranks,
        f"{ranks_phrase(ranks)} {_is(ranks)} blocked sending weights in {_bare(frame)}() at "
        f"{frame.short_filename}:{frame.line}, and {side}{rest}.",
        [_worker(s) for s in idle],
    )


def _rollout_stalled(evidence: Evidence, waiting: dict[int, Frame]) -> RolloutFinding:
    ranks = sorted(waiting)
    frame = waiting[ranks[0]]
    cause, confidence, culprits, why = _cause(evidence, waiting)
    return RolloutFinding(
        "rollout_stalled",
        cause,
        confidence,
        [],
        f"{ranks_phrase(ranks)} {_is(ranks)} waiting for rollouts in {_bare(frame)}() at "
        f"{frame.short_filename}:{frame.line}: {why}.",
        [_worker(s) for s in culprits],
    )


def _cause(
    evidence: Evidence, waiting: dict[int, Frame]
) -> tuple[str, float, list[dict[str, Any]], str]:
    servers = evidence.servers
    awaited = _awaited(evidence)
    for state, cause, what in (
        ("unreachable", "inference_unreachable", "refuses connections (dead?)"),
        ("unresponsive", "inference_wedged", "accepts connections but does not answer /health"),
        ("unhealthy", "inference_wedged", "answers /health with an error"),
    ):
        bad = [s for s in servers if s.get("state") == state]
        if bad:
            return cause, 0.9, bad, f"the inference server {_addresses(bad)} {what}"
    paused = [s for s in servers if _looks_paused(s, awaited)]
    if paused:
        queued = sum(int(s.get("queued") or 0) for s in paused)
        return (
            "inference_paused",
            0.9 if any(s.get("paused") is True for s in paused) else 0.7,
            paused,
            f"the inference server {_addresses(paused)} is paused (generation paused for a weight "
            f"update and never resumed?) with {queued} request(s) queued",
        )
    rejected = max((len(_REJECTED.findall(r.log_tail)) for r in evidence.ranks), default=0)
    if rejected >= REJECTIONS_FOR_FAILING:
        return (
            "workflow_failing",
            0.75,
            [],
            f"episodes keep failing and being rejected ({rejected} rejections in one log tail), "
            "so the batch never fills",
        )
    capacity_wait = [
        r
        for r in evidence.ranks
        if r.rank in waiting and _first(r, lambda f: _CAPACITY.search(f.name))
    ]
    if capacity_wait and not any(_is_episode(t) for r in evidence.ranks for t in r.tasks):
        return (
            "staleness_blocked",
            0.8,
            [],
            "the staleness control leaves no capacity to start a rollout and none is in flight "
            "(check max_head_offpolicyness and max_concurrent_rollouts per rollout worker)",
        )
    return "unknown", 0.4, [], "the inference servers look healthy; read the task dumps"


def _is_episode(task: dict[str, Any]) -> bool:
    """A pending rollout: some link of its await chain is an episode or generation call."""
    return any(link["name"].rsplit(".", 1)[-1] in EPISODE_CALLS for link in task.get("chain", []))


def _looks_paused(server: dict[str, Any], awaited: set[str]) -> bool:
    if server.get("state") != "up":
        return False
    if server.get("paused") is True:
        return True
    return bool(server.get("queued")) and not server.get("running") and server["address"] in awaited


def _awaited(evidence: Evidence) -> set[str]:
    return {t["awaiting"] for r in evidence.ranks for t in r.tasks if t.get("awaiting")}


def _first(rank: RankEvidence, test: Any) -> Frame | None:
    """The outermost frame of any thread that passes ``test`` (the main thread first)."""
    main = rank.main_thread()
    threads = [main, *(t for t in rank.threads if t is not main)] if main else rank.threads
    for thread in threads:
        for frame in reversed(thread.frames):
            if test(frame):
                return frame
    return None


def _worker(server: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "inference_server",
        "address": server.get("address"),
        "state": server.get("state"),
        "node": server.get("node"),
        "pid": server.get("pid"),
    }


def _addresses(servers: list[dict[str, Any]]) -> str:
    return ", ".join(str(s.get("address")) for s in servers)


def _bare(frame: Frame) -> str:
    return frame.name.rsplit(".", 1)[-1]


def _is(ranks: list[int]) -> str:
    return "is" if len(ranks) == 1 else "are"


def _them(ranks: list[int]) -> str:
    return "it" if len(ranks) == 1 else "them"
