"""A log that repeats one line is a retry loop, not work: what the report quotes of a culprit
rank's stderr when most of its last lines say the same thing (numbers aside: a retry count, a
port, a timestamp). Its writes are no movement either (``evidence.kernel_readings.log_writes``);
this names the loop for the person reading. Only stderr is read: a rank's stdout repeats its step
line by design. Pure."""

from __future__ import annotations

import re
from collections import Counter

from areal_watchdog.diagnose.verdict import Verdict
from areal_watchdog.evidence.model import Evidence

MIN_LINES = 8  # fewer lines say nothing about a loop
REPEATED_SHARE = 0.6  # of the last lines, the share one line must have
QUOTED_CHARS = 200
_NUMBERS = re.compile(r"\d+(\.\d+)?")


def repeated_line(log_tail: str) -> tuple[str, int, int] | None:
    """(the repeated line, how many times, of how many lines) in the stderr part of a rank's
    log tail (``--- stderr.log ---`` onwards, as ``evidence.gather`` writes it)."""
    _, marker, stderr = log_tail.partition("--- stderr.log ---")
    lines = [line.strip() for line in stderr.splitlines() if line.strip()] if marker else []
    if len(lines) < MIN_LINES:
        return None
    shapes = [_NUMBERS.sub("N", line) for line in lines]
    shape, count = Counter(shapes).most_common(1)[0]
    if count < REPEATED_SHARE * len(lines):
        return None
    last = len(shapes) - 1 - shapes[::-1].index(shape)
    return lines[last][:QUOTED_CHARS], count, len(lines)


def flood_note(verdict: Verdict, evidence: Evidence) -> str:
    """``Rank 1 writes the same line again and again (18 of its last 20 stderr lines):
    `WARNING ... refused`: a retry loop, not work.`` for each culprit rank (each rank when
    none is named) whose stderr repeats one line."""
    ranks = [r for r in evidence.ranks if r.rank in verdict.culprit_ranks] or evidence.ranks
    notes = []
    for rank in ranks:
        found = repeated_line(rank.log_tail)
        if found is not None:
            line, count, total = found
            notes.append(
                f"Rank {rank.rank} writes the same line again and again ({count} of its last "
                f"{total} stderr lines): `{line}`: a retry loop, not work."
            )
    return " ".join(notes[:2])
