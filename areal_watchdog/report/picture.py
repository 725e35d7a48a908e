"""Draws an incident's timeline in a process of its own, started once the report is posted
(``watch/timelines/timeline_drawings.py``), so the report is never late for it:

    python -m areal_watchdog.report.picture INCIDENT_DIR

Writes ``timeline.json`` (the data, always), then ``timeline.svg`` and ``timeline.png`` with
matplotlib (the ``[plots]`` extra), and puts the picture, or how to get it, in ``report.md`` in
place of its "being drawn" line."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import read_json, write_json_atomic, write_text_atomic
from areal_watchdog.report.markdown import TIMELINE_PENDING
from areal_watchdog.report.timeline import timeline
from areal_watchdog.rundir.layout import SUSPECTED
from areal_watchdog.rundir.progress.history import History

PNG_DPI = 100
WIDTH_IN = 11.0
ROW_IN = 0.28  # the height of one rank row
LANE_IN = 1.3
STATE_COLOURS = {"blocked": "#9e9e9e", "running": "#f5a623", "exited": "#424242",
                 "unresponsive": "#8e44ad"}  # fmt: skip
LOOK_COLOURS = {"suspected": "#1f77b4", "first look": "#ff7f0e", "second look": "#d62728",
                "proof": "#d62728", "hard limit": "#000000"}  # fmt: skip
NO_PLOTS = (
    "Timeline: not drawn: matplotlib is not installed here (`pip install "
    "'areal-watchdog[plots]'`, then `python -m areal_watchdog.report.picture {dir}`); its data "
    "is in `timeline.json`."
)


def main(argv: list[str]) -> int:
    """Draw one incident's timeline; 2 (and a line) when the folder holds no readable report."""
    if len(argv) != 1 or not isinstance(read_json(Path(argv[0]) / "report.json"), dict):
        print("usage: python -m areal_watchdog.report.picture INCIDENT_DIR (an incident folder "
              "with its report.json)", file=sys.stderr)  # fmt: skip
        return 2
    folder = Path(argv[0])
    mode = (folder / "report.json").stat().st_mode & 0o777
    data = timeline_of(folder)
    write_json_atomic(folder / "timeline.json", data, mode=mode)
    try:
        draw(data, folder, mode)
    except ImportError:
        line = NO_PLOTS.format(dir=folder)
    except Exception as exc:  # noqa: BLE001 - the report says why, the data stays
        line = f"Timeline: not drawn: {type(exc).__name__}: {exc}; its data is in `timeline.json`."
    else:
        line = "![timeline](timeline.svg) (also `timeline.png`; its data in `timeline.json`)"
    _put_in_report(folder / "report.md", line, mode)
    return 0


def timeline_of(folder: Path) -> dict[str, Any]:
    """The data from the incident's files and the suspected looks beside it."""
    report = read_json(folder / "report.json")
    history = History.from_dict(read_json(folder / "history.json"))
    looks = sorted((folder.parent.parent / SUSPECTED).glob("*/report.json"))
    earlier = [read_json(p) for p in looks]
    return timeline(report, history, [r for r in earlier if isinstance(r, dict)])


def draw(data: dict[str, Any], folder: Path, mode: int = 0o600) -> None:
    """``timeline.svg`` and ``timeline.png``: the rank rows on top, a lane per unit below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    units = sorted({lane["unit"] for lane in data["lanes"]}, key=_unit_order)
    heights = [max(1.2, ROW_IN * len(data["rows"]) + 0.6)] + [LANE_IN] * len(units)
    figure, axes = plt.subplots(
        len(heights), 1, sharex=True, squeeze=False, figsize=(WIDTH_IN, sum(heights) + 0.9),
        gridspec_kw={"height_ratios": heights},
    )  # fmt: skip
    top = axes[0][0]
    _rows(top, data)
    for axis, unit in zip((a[0] for a in axes[1:]), units, strict=True):
        lanes = [lane for lane in data["lanes"] if lane["unit"] == unit]
        for lane in lanes:
            xs, ys = zip(*lane["points"], strict=True) if lane["points"] else ((), ())
            axis.plot(xs, ys, marker="." if lane["kind"] == "server" else None, label=lane["name"])
        axis.set_ylabel(unit, fontsize=8)
        axis.legend(fontsize=6, loc="upper left", ncol=1 + len(lanes) // 8)
    for axis in (a[0] for a in axes):
        axis.axvspan(data["stall"]["from"], data["stall"]["to"], color="#d62728", alpha=0.08)
        for look in data["looks"]:
            axis.axvline(look["t"], color=LOOK_COLOURS.get(look["kind"]), linestyle="--", lw=1)
    axes[-1][0].set_xlabel(f"seconds from the {data['since']}")
    axes[-1][0].set_xlim(data["start"], data["end"])
    culprits = ", ".join(row["label"] for row in data["rows"] if row["culprit"]) or "none named"
    figure.suptitle(f"{data['category']}: culprit {culprits} (last step {data['last_step']})")
    figure.tight_layout()
    for name, dpi in (("timeline.svg", None), ("timeline.png", PNG_DPI)):
        picture = io.BytesIO()  # drawn in memory, then written as every file here is
        figure.savefig(picture, format=name.rsplit(".", 1)[1], dpi=dpi)
        write_text_atomic(folder / name, picture.getvalue(), mode=mode)
    plt.close(figure)


def _rows(axis: Any, data: dict[str, Any]) -> None:
    """A bar per row: stepping before the last step, its state after; culprits in red."""
    rows = data["rows"]
    for y, row in enumerate(rows):
        axis.barh(y, -data["start"], left=data["start"], color="#c8e6c9", height=0.7)
        colour = STATE_COLOURS.get(row["state"], "#bdbdbd")
        edge = "#d62728" if row["culprit"] else colour
        axis.barh(y, data["end"], left=0, color=colour, edgecolor=edge, lw=2, height=0.7)
        axis.text(0.1, y, f"{row['state']}: {row['where']}"[:90], fontsize=6, va="center")
    axis.set_yticks(range(len(rows)))
    labels = axis.set_yticklabels(
        [f"{r['label']}{' (culprit)' if r['culprit'] else ''}" for r in rows], fontsize=7
    )
    for label, row in zip(labels, rows, strict=True):
        label.set_color("#d62728" if row["culprit"] else "black")
    axis.invert_yaxis()
    for step in data["steps"]:
        axis.axvline(step["t"], color="#2e7d32", lw=0.6, alpha=0.6)
    zero = "start" if data["last_step"] is None else f"last step {data['last_step']}"
    axis.annotate(zero, (0, -0.6), fontsize=7, color="#2e7d32",
                  rotation=30, annotation_clip=False)  # fmt: skip
    for look in data["looks"]:
        axis.annotate(look["kind"], (look["t"], -0.6), fontsize=7, rotation=30,
                      color=LOOK_COLOURS.get(look["kind"]), annotation_clip=False)  # fmt: skip


UNITS = ("GPUs", "%", "W", "tokens/s", "queued")  # the lanes' order, top to bottom


def _unit_order(unit: str) -> tuple[int, str]:
    return (UNITS.index(unit) if unit in UNITS else len(UNITS), unit)


def _put_in_report(path: Path, line: str, mode: int) -> None:
    """Replace the "being drawn" line (or an earlier picture line) with ``line``."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return
    marks = (TIMELINE_PENDING, "![timeline]", "Timeline: not drawn")
    lines = [line if any(old.startswith(m) for m in marks) else old for old in lines]
    write_text_atomic(path, "\n".join(lines) + "\n", mode=mode)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
