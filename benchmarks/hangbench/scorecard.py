"""Scores and the scorecard: per case and tool the seconds from the hang to the tool's first
signal and whether it named the right kind and culprit, false alarms on the healthy cases, and
per tool the totals; as JSON for machines, a markdown table and a plot for people."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from benchmarks.hangbench.cases import Case, Label
from benchmarks.hangbench.runs import Run
from benchmarks.hangbench.tools import Signal


@dataclass(frozen=True)
class Score:
    """One tool on one run of one case."""

    case: str
    tool: str
    repeat: int
    healthy: bool
    signal: Signal | None = None
    seconds: float | None = None  # hang to signal (a hang case), launch to signal (healthy)
    kind_ok: bool | None = None
    culprit_ok: bool | None = None  # None: the label names no rank, or nothing was found
    empty: str = ""  # why the cell is empty (the tool could not run here)
    doubt: str = ""  # the run contradicted the label: it scores for no tool
    culprit_labelled: bool = False  # the label names culprit ranks (found or not)
    saw: str = ""  # what the tool saw short of a signal (the watchdog: the looks it wrote)
    silence_s: float | None = None  # a healthy run's longest time between steps: its phase ran
    shared: str = ""  # the tools that read this run, joined by '+' (sharing.py); '' alone

    @property
    def detected(self) -> bool:
        return not self.healthy and self.signal is not None and (self.seconds or 0) >= 0

    @property
    def right(self) -> bool:
        """The headline: found, of the right kind, and naming the labelled culprit (where the
        label names one)."""
        culprit = self.culprit_ok if self.culprit_labelled else True
        return self.detected and bool(self.kind_ok) and bool(culprit)

    @property
    def false_alarm(self) -> bool:
        return self.signal is not None and (self.healthy or (self.seconds or 0) < 0)


def score(
    case: Case, run: Run, tool: str, repeat: int, signal: Signal | None, window: float,
    saw: str = "", shared: str = "",
) -> Score:  # fmt: skip
    """A signal later than ``window`` seconds after the hang (the case's limit, or the tool's
    own longer timeout, and the grace a timeout set to it needs) is none;
    a healthy run keeps how long its longest silence lasted (its phase ran) and what the tool
    saw of it."""
    label = case.label
    labelled = bool(label.culprit_ranks or label.culprit_server) and not label.healthy
    if label.healthy:
        seconds = signal.at - run.started if signal else None
        return Score(case.name, tool, repeat, True, signal, seconds, saw=saw,
                     silence_s=run.longest_silence(), shared=shared)  # fmt: skip
    if signal is None:
        return Score(case.name, tool, repeat, False, culprit_labelled=labelled, saw=saw,
                     shared=shared)  # fmt: skip
    hang_at = run.step_at(label.after_step)
    seconds = signal.at - hang_at if hang_at else None
    if seconds is None or seconds > window:
        return Score(case.name, tool, repeat, False, culprit_labelled=labelled, shared=shared)
    culprit_ok = _culprit_ok(label, signal, run) if labelled else None
    kind_ok = label.kind in signal.kind.split("/")
    return Score(case.name, tool, repeat, False, signal, seconds, kind_ok, culprit_ok,
                 culprit_labelled=labelled, shared=shared)  # fmt: skip


def _culprit_ok(label: Label, signal: Signal, run: Run) -> bool:
    """Exactly the labelled ranks, or, for a server's hang, exactly the server the job started
    (its address) and no rank."""
    if label.culprit_server:
        served = run.servers()
        return len(served) == 1 and set(signal.servers) == served and not signal.culprits
    return set(signal.culprits) == set(label.culprit_ranks)


def totals(scores: list[Score], tool: str) -> dict[str, object]:
    """One tool's line: every count over every labelled run (found or not), never over only
    what the tool found; the seconds over what it found."""
    mine = [s for s in scores if s.tool == tool and not s.empty and not s.doubt]
    hangs = [s for s in mine if not s.healthy]
    found = [s for s in hangs if s.detected]
    seconds = [s.seconds for s in found if s.seconds is not None]
    named = [s for s in hangs if s.culprit_labelled]
    return {
        "tool": tool,
        "hangs": len(hangs),
        "right": sum(s.right for s in hangs),
        "detected": len(found),
        "min_s": round(min(seconds), 1) if seconds else None,
        "median_s": round(statistics.median(seconds), 1) if seconds else None,
        "max_s": round(max(seconds), 1) if seconds else None,
        "right_kind": sum(bool(s.kind_ok) for s in found),
        "culprit_cases": len(named),
        "right_culprit": sum(bool(s.culprit_ok) for s in named if s.detected),
        "healthy": len(mine) - len(hangs),
        "false_alarms": sum(s.false_alarm for s in mine),
        "empty": sum(s.tool == tool and bool(s.empty) for s in scores),
        "doubts": sum(s.tool == tool and bool(s.doubt) for s in scores),
    }


def write(scores: list[Score], cases: list[Case], tools: list[str], out: Path, meta: dict) -> None:
    """scorecard.json, scorecard.md and scorecard.png under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    summary = [totals(scores, t) for t in tools]
    data = {**meta, "totals": summary, "scores": [_plain(s) for s in scores],
            "cases": {c.name: {"title": c.title, **asdict(c.label)} for c in cases}}  # fmt: skip
    (out / "scorecard.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    (out / "scorecard.md").write_text(markdown(scores, cases, tools, summary, meta))
    _plot(scores, cases, tools, out / "scorecard.png")


def read(path: Path) -> tuple[dict, list[Score]]:
    """A scorecard.json written by ``write``: its run's facts and its scores, to go on from."""
    data = json.loads(path.read_text())
    names = {f.name for f in fields(Score)}
    scores = []
    for plain in data["scores"]:
        kept = {k: v for k, v in plain.items() if k in names}
        if kept.get("signal"):
            signal = kept["signal"]
            kept["signal"] = Signal(**{**signal, "culprits": tuple(signal["culprits"]),
                                       "servers": tuple(signal.get("servers", ()))})  # fmt: skip
        scores.append(Score(**kept))
    meta = {k: v for k, v in data.items() if k not in ("totals", "scores", "cases")}
    return meta, scores


def markdown(scores: list[Score], cases: list[Case], tools: list[str], summary: list[dict],
             meta: dict) -> str:  # fmt: skip
    doubts = sum(bool(s.doubt) for s in scores)
    resumed = ", resumed on " + ", ".join(meta["resumed_on"]) if meta.get("resumed_on") else ""
    where = f"{meta.get('commit', '?')}{resumed} ({meta.get('machine', '?')})"
    healthy = sum(c.label.healthy for c in cases)
    subset = f"{meta['subset']}, " if meta.get("subset") else ""
    cells = meta.get("cells") or len(scores)
    partial = f" **Partial: {len(scores)} of {cells} cells so far.**" if len(scores) < cells else ""
    lines = [f"HangBench, {meta['when']}, on {where}: {len(cases)} cases ({subset}{healthy} "
             "healthy), "
             f"{meta['repeat']} run(s) each, each tool on runs of its own (PyTorch's three "
             "rows on one, with the shortest timeout, until it fires), "
             f"{meta['minutes']:.1f} min; {doubts} run(s) contradicted their label and score "
             f"for no tool.{partial}", "",
             "| tool | right kind and culprit | found | seconds min / median / max "
             "| right kind | right culprit | false alarms |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for t in summary:
        spread = " / ".join(str(t[k] or "-") for k in ("min_s", "median_s", "max_s"))
        lines.append(
            f"| {t['tool']} | **{t['right']} of {t['hangs']}** | {t['detected']} of {t['hangs']} "
            f"| {spread} | {t['right_kind']} of {t['hangs']} "
            f"| {t['right_culprit']} of {t['culprit_cases']} "
            f"| {t['false_alarms']} of {t['healthy']} |"
        )
    lines += ["", "| case | label | " + " | ".join(tools) + " |",
              "|---|---|" + "---|" * len(tools)]  # fmt: skip
    for case in cases:
        mine = [s for s in scores if s.case == case.name]
        cells = [_cell([s for s in mine if s.tool == t]) for t in tools]
        lines.append(f"| `{case.name}` | {_label(case)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _label(case: Case) -> str:
    label = case.label
    if label.healthy:
        return f"healthy: {case.title}"
    ranks = f" rank {','.join(map(str, label.culprit_ranks))}" if label.culprit_ranks else ""
    return f"{label.kind}{ranks}, after step {label.after_step}"


def _cell(runs: list[Score]) -> str:
    """One tool's runs of one case, in a few words."""
    if not runs:
        return ""
    if runs[0].empty:
        return f"- ({runs[0].empty})"
    return "<br>".join(_one(s) for s in runs)


def _one(s: Score) -> str:
    if s.doubt:
        return f"- ({s.doubt})"
    if s.healthy:
        silence = f"silence {s.silence_s:.0f} s" if s.silence_s is not None else "no step"
        seen = "; ".join(x for x in (silence, s.saw) if x)
        return (f"**false alarm** at {s.seconds:.1f} s" if s.signal else "quiet") + f" ({seen})"
    if s.signal is None:
        return "missed"
    if s.false_alarm:
        return f"**early** ({s.seconds:.1f} s before the hang)"
    kind = "kind ok" if s.kind_ok else f"kind {s.signal.kind or 'none'}"
    who = (
        ""
        if s.culprit_ok is None
        else (", culprit ok" if s.culprit_ok else f", culprit {_named(s.signal) or 'none'}")
    )
    return f"{s.seconds:.1f} s, {kind}{who}"


def _named(signal: Signal) -> list:
    return [*signal.culprits, *signal.servers]


def _plain(s: Score) -> dict:
    return {**asdict(s), "detected": s.detected, "right": s.right, "false_alarm": s.false_alarm}


def _plot(scores: list[Score], cases: list[Case], tools: list[str], path: Path) -> None:
    """Seconds to the first signal per hang case and tool (missed at the right edge), and the
    false alarms per tool in the legend."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    hangs = [c for c in cases if not c.label.healthy]
    limit = max((c.limit for c in hangs), default=30.0) + 10
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(hangs) + 1.5))
    for i, tool in enumerate(tools):
        xs, ys = [], []
        for y, case in enumerate(hangs):
            for s in scores:
                if s.case == case.name and s.tool == tool and not s.empty:
                    xs.append(s.seconds if s.detected and s.seconds is not None else limit)
                    ys.append(y + (i - len(tools) / 2) * 0.15)
        alarms = totals(scores, tool)["false_alarms"]
        ax.scatter(xs, ys, s=18, label=f"{tool} ({alarms} false alarms)")
    ax.axvline(limit, color="grey", linestyle=":")
    ax.set_yticks(range(len(hangs)), [c.name for c in hangs], fontsize=7)
    ax.set_xlabel(f"seconds from the hang to the first signal (missed: at {limit:g} s)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
