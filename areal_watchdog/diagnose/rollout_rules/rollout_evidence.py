"""Reading the rollout side of a job's evidence, for the rules of ``rollout`` and
``weight_sync``: the outermost frame that passes a test, a task's await chain, the names of
processes and servers as summaries give them, and the finding both rule sets return."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from areal_watchdog.common.rankset import ranks_phrase
from areal_watchdog.evidence.model import (
    Frame,
    RankEvidence,
)

SERVER = "inference_server"
EPISODE_CALLS = frozenset(
    {"_execute_workflow", "arun_episode", "agenerate", "arequest_with_retry", "generate"}
)
# An episode's own calls: a pending request under none of them is no generation (an update's).
EPISODE_ROOTS = frozenset({"_execute_workflow", "arun_episode", "agenerate", "generate"})
GENERATION_CALLS = frozenset({"agenerate", "arequest_with_retry", "generate", "_arequest"})


@dataclass
class RolloutFinding:
    """What the rollout rules concluded; the classifier turns it into its Verdict."""

    category: str
    cause: str | None
    confidence: float
    culprit_ranks: list[int]
    summary: str
    culprit_workers: list[dict[str, Any]] = field(default_factory=list)


def first(process: RankEvidence, test: Any) -> Frame | None:
    """The outermost frame of any thread that passes ``test`` (the main thread first)."""
    main = process.main_thread()
    threads = [main, *(t for t in process.threads if t is not main)] if main else process.threads
    for thread in threads:
        for frame in reversed(thread.frames):
            if test(frame):
                return frame
    return None


def server_entry(server: dict[str, Any]) -> dict[str, Any]:
    """A server as a culprit entry of the verdict."""
    return {
        "role": SERVER,
        "address": server.get("address"),
        "state": server.get("state"),
        "node": server.get("node"),
        "pid": server.get("pid"),
    }


def names(processes: list[RankEvidence]) -> str:
    """``rank 0``, ``ranks 0-3``, ``the controller (pid 12)``, ``rollout 0 (pid 14, node n1)``."""
    ranked = [p.rank for p in processes if p.rank is not None and p.role in (None, "rank")]
    parts = [ranks_phrase(sorted(ranked))] if ranked else []
    for p in processes:
        if p.rank is not None and p.role in (None, "rank"):
            continue
        name = "the controller" if p.role == "controller" else p.label()
        parts.append(f"{name} (pid {p.pid}{f', node {p.node}' if p.node else ''})")
    return ", ".join(parts)


def addresses(servers: list[dict[str, Any]]) -> str:
    """``127.0.0.1:8000, 127.0.0.1:8001``."""
    return ", ".join(str(s.get("address")) for s in servers)


def bare_name(frame: Frame) -> str:
    """A frame's function without its class: ``prepare_batch``."""
    return frame.name.rsplit(".", 1)[-1]


def links(task: dict[str, Any]) -> set[str]:
    """The bare function names of a task's await chain."""
    return {link_name(link) for link in task.get("chain", [])}


def link_name(link: dict[str, Any]) -> str:
    """One link of an await chain, bare: ``arun_episode``."""
    return str(link.get("name", "")).rsplit(".", 1)[-1]
