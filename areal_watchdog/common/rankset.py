"""Compact rank lists for people: ``[0, 1, 2, 3, 5]`` -> ``"0-3, 5"``."""

from __future__ import annotations

from collections.abc import Iterable


def format_ranks(ranks: Iterable[int]) -> str:
    """Collapse runs of consecutive ranks into ranges."""
    values = sorted(set(ranks))
    parts: list[str] = []
    start = prev = None
    for value in values:
        if prev is not None and value == prev + 1:
            prev = value
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = value
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ", ".join(parts)


def parse_ranks(text: str) -> tuple[int, ...]:
    """The inverse of ``format_ranks``: ``"0-3, 5"`` -> ``(0, 1, 2, 3, 5)``; ValueError when
    a part is not a number or a range."""
    values: set[int] = set()
    for part in text.replace(" ", "").split(","):
        first, dash, last = part.partition("-")
        low, high = int(first), int(last if dash else first)
        if low < 0 or high < low:
            raise ValueError(part)
        values.update(range(low, high + 1))
    return tuple(sorted(values))


def ranks_phrase(ranks: Iterable[int]) -> str:
    """``"rank 3"`` or ``"ranks 0-2, 5"``."""
    values = sorted(set(ranks))
    return f"rank {values[0]}" if len(values) == 1 else f"ranks {format_ranks(values)}"


def worker_label(worker: dict) -> str:
    """A culprit that is not (only) a rank, for people: ``rollout 0 (pid 12, node n1)``,
    ``inference_server 127.0.0.1:30000 (unreachable, pid 14)``, ``rank 0 (pid 9, node n1)``."""
    role = worker.get("role") or "process"
    if role == "rank":
        name = f"rank {worker.get('rank')}"
    else:
        where = worker.get("address") or worker.get("index")
        name = role if where is None else f"{role} {where}"
    facts = [str(worker["state"])] if worker.get("state") else []
    facts += [f"{k} {worker[k]}" for k in ("pid", "node") if worker.get(k) is not None]
    return f"{name} ({', '.join(facts)})" if facts else name


def culprits_phrase(ranks: Iterable[int], workers: Iterable[dict]) -> str:
    """``culprit ranks 0-2``, ``culprit workers rollout 0 (pid 12)``, both, or neither named."""
    parts = []
    if format_ranks(ranks):
        parts.append(f"culprit ranks {format_ranks(ranks)}")
    labels = [worker_label(w) for w in workers]
    if labels:
        parts.append(f"culprit workers {'; '.join(labels)}")
    return ", ".join(parts) or "culprit ranks none named"
