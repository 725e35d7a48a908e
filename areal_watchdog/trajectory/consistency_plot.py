"""The picture beside the consistency table: per step, how the trained tokens' log-prob gaps
spread over decades (people look at this before they read the table). Plain SVG, written by
hand: no plotting library on the sidecar's or the launcher's path."""

from __future__ import annotations

from html import escape

from areal_watchdog.trajectory.consistency import StepConsistency, histogram

EDGES = (1e-4, 1e-3, 1e-2, 0.1, 0.5, 1.0, 2.0)
LABELS = ("<1e-4", "<1e-3", "<0.01", "<0.1", "<0.5", "<1", "<2", ">=2")
BAR_W, BAR_GAP, ROW_H, LEFT, TOP = 56, 8, 120, 90, 40


def svg(steps: list[StepConsistency], threshold: float) -> str:
    """One row of bars per step: the share of tokens in each |engine - trainer| bin, the bins
    past the threshold in red."""
    width = LEFT + len(LABELS) * (BAR_W + BAR_GAP) + 20
    height = TOP + len(steps) * ROW_H + 30
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<text x="{LEFT}" y="20" font-size="13">|engine - trainer| log-prob per trained token '
        f"(share of tokens; red: past {threshold:g})</text>",
    ]
    for row, step in enumerate(steps):
        parts += _row(step, TOP + row * ROW_H, threshold)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _row(step: StepConsistency, top: int, threshold: float) -> list[str]:
    counts = histogram(step.gaps, EDGES)
    total = max(sum(counts), 1)
    base = top + ROW_H - 30
    parts = [f'<text x="8" y="{base - 40}">step {step.step}</text>',
             f'<text x="8" y="{base - 24}">{step.tokens} tokens</text>']  # fmt: skip
    lower = (0.0, *EDGES)
    for i, (label, count) in enumerate(zip(LABELS, counts, strict=True)):
        x = LEFT + i * (BAR_W + BAR_GAP)
        h = round((ROW_H - 50) * count / total)
        color = "#c0392b" if lower[i] >= threshold else "#2e86c1"
        parts += [
            f'<rect x="{x}" y="{base - h}" width="{BAR_W}" height="{h}" fill="{color}"/>',
            f'<text x="{x + BAR_W / 2}" y="{base + 14}" text-anchor="middle">'
            f"{escape(label)}</text>",
            f'<text x="{x + BAR_W / 2}" y="{base - h - 3}" text-anchor="middle">'
            f"{100 * count / total:.0f}%</text>",
        ]
    return parts
