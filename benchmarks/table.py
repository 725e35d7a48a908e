"""How a benchmark's result is shown: a titled table, each measure beside its target; apart
from ``run`` so that a benchmark run on its own prints the same without importing every other."""

from __future__ import annotations

import sys


def print_table(
    title: str,
    rows: list[tuple[str, ...]],
    header: tuple[str, ...] = ("measure", "measured", "target"),
) -> None:
    """Print rows (``(measure, value, target)`` unless another header is given) under a title."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(f"\n## {title}\n")
    for cells in (header, tuple("-" * w for w in widths), *rows):
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    sys.stdout.flush()
