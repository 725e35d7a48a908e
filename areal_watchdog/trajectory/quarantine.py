"""The quarantine file: training rows a bisection found to hang, left out of a resumed run.

A dumped group is one dataset row's rollouts; its prompt (the tokens before the first trained
token, decoded) is what the file keeps, readable by people. The resumed run leaves out every
dataset row whose distinguishing text appears in a quarantined prompt: a chat row's user
messages (its system message is shared by many rows), else one of its texts of 16+ characters.
A match that would leave out more than ``MAX_PER_ROW`` rows per quarantined row matches a text
many rows share: it is refused, in one line, and the rows stay. How many rows the resumed run
left out is written beside the file (``APPLIED``) for the launcher's record. Kept free of
torch: the launcher and the ranks both read it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import read_json, write_json_atomic
from areal_watchdog.rundir.layout import ENV_RUN_ID

ENV_QUARANTINE = "AREAL_WATCHDOG_QUARANTINE"  # the file a resumed run leaves rows out by
APPLIED = "quarantine_applied.json"  # beside it: what the resumed run's filter left out
MIN_MATCH = 16  # shorter texts ("user", a number) would match rows that merely share them
MAX_PER_ROW = 4  # more matches per quarantined row: a shared text, not the row (refused)
RULE = (
    "a training row is left out when its user messages (a chat row), else one of its texts of "
    f"{MIN_MATCH}+ characters, appear in a quarantined prompt; a match of more than "
    f"{MAX_PER_ROW} rows per quarantined row is refused"
)


@dataclass(frozen=True)
class QuarantinedRow:
    """One row: where the bisection found it and what it asked."""

    step: int
    group: int  # its index in the step's global batch
    incident_id: str
    prompt: str


def add_rows(path: Path, rows: list[QuarantinedRow]) -> list[QuarantinedRow]:
    """Append ``rows`` to the file (created with its rule); every row it now holds."""
    held = read_rows(path)
    known = {row.prompt for row in held}
    held += [row for row in rows if row.prompt not in known]
    write_json_atomic(path, {"rule": RULE, "rows": [asdict(row) for row in held]})
    return held


def read_rows(path: Path) -> list[QuarantinedRow]:
    """The rows of a quarantine file; none when it is missing or damaged."""
    doc = read_json(path)
    entries = doc.get("rows") if isinstance(doc, dict) else None
    rows = []
    for entry in entries if isinstance(entries, list) else []:
        try:
            rows.append(QuarantinedRow(**entry))
        except TypeError:
            continue
    return rows


def texts(row: Any) -> list[str]:
    """Every string of a dataset row, nested lists and dicts included (``messages``)."""
    if isinstance(row, str):
        return [row]
    if isinstance(row, dict):
        return [t for value in row.values() for t in texts(value)]
    if isinstance(row, list | tuple):
        return [t for value in row for t in texts(value)]
    return []


def user_texts(row: Any) -> list[str]:
    """The contents of a chat row's user messages (any ``{"role": "user", "content": ...}``
    in it), none for another row."""
    if isinstance(row, dict) and row.get("role") == "user":
        return texts(row.get("content"))
    values = row.values() if isinstance(row, dict) else row if isinstance(row, list | tuple) else []
    return [t for value in values for t in user_texts(value)]


def is_quarantined(row: Any, prompts: list[str]) -> bool:
    """Whether ``row`` is one of the quarantined rows (``RULE``): a chat row when every one
    of its user texts is in one prompt, another when one of its long texts is in one."""
    users = [t for t in user_texts(row) if t.strip()]
    if sum(len(t) for t in users) >= MIN_MATCH:
        return any(all(t in p for t in users) for p in prompts)
    return any(len(t) >= MIN_MATCH and t in p for t in texts(row) for p in prompts)


def too_many(left_out: int, quarantined: int) -> bool:
    """A match of more rows than the quarantine can mean: a text many rows share."""
    return left_out > MAX_PER_ROW * quarantined


def refusal(left_out: int, total: int, quarantined: int, path: Path | str) -> str:
    """The one line that says a match was refused, and why."""
    return (
        f"refused: the {quarantined} quarantined prompt(s) of {path} match {left_out} of "
        f"{total} rows (more than {MAX_PER_ROW} per quarantined row: a text many rows share, "
        "not the rows); training on every row"
    )


def without_quarantined(rows: Sequence[Any], path: Path | str | None = None) -> list[Any]:
    """``rows`` less the quarantined ones (``path``: the run's file, by default the resumed
    run's ``AREAL_WATCHDOG_QUARANTINE``); says in one line what it left out, or that the
    match was refused, and writes the count for the launcher's record."""
    path = path or os.environ.get(ENV_QUARANTINE)
    prompts = [row.prompt for row in read_rows(Path(path))] if path else []
    if not prompts:
        return list(rows)
    kept = [row for row in rows if not is_quarantined(row, prompts)]
    left_out = len(rows) - len(kept)
    if too_many(left_out, len(prompts)):
        say_left_out(Path(path), 0, len(rows), refusal(left_out, len(rows), len(prompts), path))
        return list(rows)
    said = f"{left_out} row(s) of the training data left out, as {path} lists"
    say_left_out(Path(path), left_out, len(rows), said)
    return kept


def say_left_out(path: Path, left_out: int, total: int, said: str) -> None:
    """Say it (rank 0, or a process of no rank) on stderr and beside the quarantine file, for
    the launcher's record."""
    if os.environ.get("RANK", "0") != "0":
        return
    print(f"[areal-watchdog] quarantine: {said}", file=sys.stderr, flush=True)
    record = {"run_id": os.environ.get(ENV_RUN_ID), "left_out": left_out, "rows": total,
              "said": said}  # fmt: skip
    with contextlib.suppress(OSError):  # the record is for people; training goes on
        write_json_atomic(path.with_name(APPLIED), record)
