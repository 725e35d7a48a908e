"""Hang kinds are declared once (``diagnose.kinds``): the report's JSON Schema, the classifier's
categories and the escalation read that table, and these tests fail when one of them drifts."""

from __future__ import annotations

import json

import jsonschema
import pytest

from areal_watchdog.cli import main
from areal_watchdog.diagnose.kinds import CATEGORIES, CAUSES, Severity, kind_of, title
from areal_watchdog.diagnose.strength import CONCLUSIVE_CATEGORIES, DAMAGE, TIME_DECIDES
from areal_watchdog.report.build import SCHEMA_VERSION, load_schema


def test_the_report_schema_names_exactly_the_declared_kinds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What ``areal-launch schema`` prints, and what every report is validated against."""
    assert main(["schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["$id"].endswith(f"/report/{SCHEMA_VERSION}")
    properties = printed["properties"]
    assert properties["category"]["enum"] == [k.name for k in CATEGORIES]
    assert properties["cause"]["enum"] == [None, *(k.name for k in CAUSES)]
    kinds = load_schema()["properties"]
    jsonschema.validate("straggler", kinds["category"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate("not_a_kind", kinds["category"])


def test_the_escalation_reads_the_table() -> None:
    assert {"rank_crashed", "node_lost", "storage_stall"} == CONCLUSIVE_CATEGORIES
    assert {"workflow_stuck"} == TIME_DECIDES and {"reward_stuck"} == DAMAGE


def test_a_cause_decides_over_its_category_and_damage_is_titled_a_warning() -> None:
    assert kind_of("rollout_stalled", "inference_unreachable").proof
    assert kind_of("not_a_kind").name == "unknown"
    assert kind_of("rollout_stalled", "reward_stuck").severity is Severity.WARNING
    report = {"category": "rollout_stalled", "cause": "reward_stuck"}
    assert title(report) == "Warning: Rewards are silently falling back to 0"
    assert title({"category": "straggler", "cause": None}) == "A rank is behind the others"
