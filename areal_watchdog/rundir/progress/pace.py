"""The job's pace as the leading sidecar sees it, in its node status: the step in progress, how
long steps take, the threshold in force, whether the GPUs work, the look that is open. The
typed record between the sidecar (writes it each poll) and ``areal-launch status`` (answers
"slow or hung?" from it with the job's own numbers, ``answer``)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Pace:
    """What "slow or hung?" is decided on: plain numbers, times in Unix seconds."""

    step: int | None  # the last step seen (None: none yet)
    since: float  # when the job last progressed (the start, before its first step)
    threshold: float  # the stall threshold in force
    learned: bool  # the threshold follows the job's own step intervals
    intervals: int = 0  # step intervals seen
    median: float | None = None
    p99: float | None = None
    longest: float | None = None
    gpus: int = 0  # the job's GPUs on the leader's node
    gpus_working: int = 0
    look: str | None = None  # the open look at this silence, for people
    look_state: str = ""  # pending (a second look decides) | time (the hard limit) | moved
    hard_limit: float | None = None  # no new step for this long ends the silence

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> Pace | None:
        """The record of a status, or None when absent or damaged."""
        if not isinstance(data, dict):
            return None
        known = {f.name for f in fields(cls)}
        try:
            pace = cls(**{k: v for k, v in data.items() if k in known})
        except TypeError:
            return None
        numbers = (pace.since, pace.threshold, pace.gpus, pace.gpus_working, pace.intervals)
        maybe = (pace.step, pace.median, pace.p99, pace.longest, pace.hard_limit)
        texts = (pace.look, pace.look_state)
        if not all(map(_number, numbers)) or not all(v is None or _number(v) for v in maybe):
            return None  # a hand-edited or forged status: no answer, never a traceback
        return pace if all(v is None or isinstance(v, str) for v in texts) else None


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def interval_summary(intervals: list[float]) -> dict[str, float | int | None]:
    """Median, 99th percentile (nearest rank) and longest of the step intervals."""
    if not intervals:
        return {"intervals": 0, "median": None, "p99": None, "longest": None}
    ordered = sorted(intervals)
    p99 = ordered[max(0, -(-99 * len(ordered) // 100) - 1)]
    return {
        "intervals": len(ordered),
        "median": statistics.median(ordered),
        "p99": p99,
        "longest": ordered[-1],
    }


def answer(pace: Pace, now: float) -> tuple[str, list[tuple[str, str]]]:
    """One line that answers "slow or hung?", and the numbers it stands on."""
    silent = max(0.0, now - pace.since)
    rows = _rows(pace, silent)
    limit = _seconds(pace.threshold)
    if pace.step is None:
        return f"starting: no step yet after {silent:.0f} s (start-up limit {limit})", rows
    doing = f"step {pace.step + 1} in progress for {silent:.0f} s"
    gpus = f"; {pace.gpus_working} of {pace.gpus} GPUs working" if pace.gpus else ""
    past = f"{doing}, past the {limit} threshold"
    if pace.look and pace.look_state == "time":
        hard = _seconds(pace.hard_limit) if pace.hard_limit is not None else "the hard limit"
        line = (
            f"slow or hung, undecided: {past}; {pace.look}: no stack tells a slow phase from a "
            f"hang here, the job is ended only after {hard} without a step"
        )
    elif pace.look and pace.look_state == "moved":
        line = f"slow, not hung: {doing}; {pace.look}"
    elif pace.look:
        line = f"looks hung: {past}; {pace.look}"
    elif silent >= pace.threshold:
        line = f"looks hung: {past}"
    elif pace.p99 is not None and silent > pace.p99:
        line = (
            f"slow, not hung: {doing}, longer than 99 % of steps ({pace.p99:.1f} s); the "
            f"watchdog looks at {limit}"
        )
    elif pace.median is not None and silent > pace.median:
        line = (
            f"progressing, slower than usual: {doing}, as steps took before (p99 {pace.p99:.1f} s)"
        )
    elif pace.median is not None:
        line = f"progressing: {doing}; it should end in about {pace.median - silent:.0f} s"
    else:
        line = f"progressing: {doing}"
    return line + gpus, rows


def _seconds(value: float) -> str:
    return f"{round(value, 1):g} s"


def _rows(pace: Pace, silent: float) -> list[tuple[str, str]]:
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} s"

    source = "learned" if pace.learned else "configured or warming up"
    rows = [
        ("last step", "-" if pace.step is None else str(pace.step)),
        ("silent for", f"{silent:.1f} s"),
        (
            "steps take",
            f"median {seconds(pace.median)}, p99 {seconds(pace.p99)}, longest "
            f"{seconds(pace.longest)} ({pace.intervals} intervals)",
        ),  # fmt: skip
        ("threshold", f"{_seconds(pace.threshold)} ({source})"),
    ]
    if pace.hard_limit is not None:
        rows.append(("hard limit", f"{_seconds(pace.hard_limit)} without a step"))
    if pace.gpus:
        rows.append(("GPUs", f"{pace.gpus_working} of {pace.gpus} working"))
    if pace.look:
        rows.append(("open look", pace.look))
    return rows
