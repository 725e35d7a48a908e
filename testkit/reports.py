"""The reports a run left, read as a user's tooling would: each validated against the shipped
schema, so that a test or a benchmark never reads one the schema would refuse."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from areal_watchdog.report.build import load_schema


def read_reports(run_dir: Path, folder: str = "incidents") -> list[dict]:
    """Every report.json of a run, oldest first, each validated against the shipped schema."""
    schema = load_schema()
    reports = []
    for path in sorted(run_dir.glob(f"{folder}/*/report.json")):
        report = json.loads(path.read_text())
        jsonschema.validate(report, schema)
        reports.append(report)
    return reports


def suspected_looks(run_dir: Path) -> list[dict]:
    """The looks at a silence that were not confirmed: written, not posted, oldest first."""
    return read_reports(run_dir, "suspected")
