"""The quarantine file: training rows a bisection found to hang, left out of a resumed run.

A dumped group is one dataset row's rollouts; its prompt (the tokens before the first trained
token, decoded) is what the file keeps, readable by people. The resumed run's trainer leaves out
every dataset row whose text appears in a quarantined prompt (``rank.areal_quarantine``):
AReaL's workflows put the row's question into the prompt verbatim, whatever the chat template
adds around it. Kept free of torch: the launcher and the ranks both read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import read_json, write_json_atomic

ENV_QUARANTINE = "AREAL_WATCHDOG_QUARANTINE"  # the file a resumed run leaves rows out by
MIN_MATCH = 16  # shorter texts ("user", a number) would match rows that merely share them
RULE = (
    f"a training row is left out when one of its texts of {MIN_MATCH}+ characters appears in "
    "a quarantined prompt"
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


def is_quarantined(row: Any, prompts: list[str]) -> bool:
    """Whether ``row`` is one of the quarantined rows (``RULE``)."""
    return any(len(t) >= MIN_MATCH and t in p for t in texts(row) for p in prompts)
