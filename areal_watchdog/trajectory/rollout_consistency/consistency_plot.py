"""The picture beside the consistency table: per step, how the trained tokens' log-prob gaps
spread over decades (people look at this before they read the table), drawn with matplotlib
(the ``[plots]`` extra). Each bar carries its bin as its id (``bin-<step>-<i>``), so a test
reads the picture's data, not its pixels."""

from __future__ import annotations

from pathlib import Path

from areal_watchdog.trajectory.rollout_consistency.consistency import StepConsistency, histogram

EDGES = (1e-4, 1e-3, 1e-2, 0.1, 0.5, 1.0, 2.0)
LABELS = ("<1e-4", "<1e-3", "<0.01", "<0.1", "<0.5", "<1", "<2", ">=2")
NO_PLOTS = "not drawn: matplotlib is not installed here (pip install 'areal-watchdog[plots]')"


def draw(steps: list[StepConsistency], threshold: float, path: Path) -> str | None:
    """One row of bars per step, the share of tokens in each |engine - trainer| bin, the bins
    past the threshold in red; the format follows ``path``'s suffix (svg, png). Why it was
    not drawn, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return NO_PLOTS
    figure, axes = plt.subplots(len(steps), 1, squeeze=False, figsize=(8, 1.0 + 1.6 * len(steps)))
    lower = (0.0, *EDGES)
    colours = ["#c0392b" if low >= threshold else "#2e86c1" for low in lower]
    for (axis,), step in zip(axes, steps, strict=True):
        counts = histogram(step.gaps, EDGES)
        shares = [100 * c / max(sum(counts), 1) for c in counts]
        bars = axis.bar(LABELS, shares, color=colours)
        for i, bar in enumerate(bars):
            bar.set_gid(f"bin-{step.step}-{i}")
        axis.bar_label(bars, fmt="%.0f%%", fontsize=7)
        axis.set_ylabel(f"step {step.step}\n{step.tokens} tokens", fontsize=8)
        axis.set_ylim(0, 115)
    title = f"|engine - trainer| log-prob per trained token (share; red: past {threshold:g})"
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return None
