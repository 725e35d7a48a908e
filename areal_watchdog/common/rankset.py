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


def ranks_phrase(ranks: Iterable[int]) -> str:
    """``"rank 3"`` or ``"ranks 0-2, 5"``."""
    values = sorted(set(ranks))
    return f"rank {values[0]}" if len(values) == 1 else f"ranks {format_ranks(values)}"
