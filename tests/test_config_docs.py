"""The keys are declared once, on the dataclasses: docs/configuration.md's ``watchdog`` table
and docs/notifications.md's table of sink types must say what the declarations say, and
``areal-launch keys`` prints them."""

from __future__ import annotations

import re

import pytest

from areal_watchdog.cli import main
from areal_watchdog.config.model import WatchdogSection
from areal_watchdog.config.reading.keys import declared
from areal_watchdog.notify.sinks.registry import SINKS, sink_class
from conftest import REPO


def table(doc: str, marker: str) -> list[list[str]]:
    """The rows (cells) of the first table from ``marker`` on, past its header."""
    text = (REPO / "docs" / doc).read_text()
    lines = text[text.index(marker) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_watchdog_table_has_every_key_and_its_default() -> None:
    documented = {row[0].strip("`"): row[1].strip("`") for row in table(
        "configuration.md", "## `watchdog`")}  # fmt: skip
    keys = {d.path.removeprefix("watchdog."): d.shown() for d in declared(WatchdogSection,
                                                                         "watchdog")}  # fmt: skip
    assert documented == keys


def test_the_sink_table_has_every_sinks_keys() -> None:
    rows = {row[0].strip("`"): row for row in table("notifications.md", "| `type` |")}
    assert sorted(rows) == sorted(SINKS)
    for kind, row in rows.items():
        keys = sink_class(kind).keys
        assert set(re.findall(r"`(\w+)`", row[1])) == set(keys.secrets), kind
        assert set(re.findall(r"`(\w+)`", row[2])) == set(keys.options), kind


@pytest.mark.parametrize("prefix", ["watchdog.gpu", "watchdog.notify[] type: pagerduty"])
def test_keys_prints_the_declarations(prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", prefix]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith(prefix) for line in lines)
    if prefix == "watchdog.gpu":
        assert len(lines) == 5 and "120" in lines[-1] and "before a look" in lines[-1]
    else:
        assert (
            "routing_key_env|routing_key_file" in lines[0] and "required: routing_key" in lines[0]
        )
