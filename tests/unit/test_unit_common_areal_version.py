"""Which AReaL a job runs, read from the job's interpreter without importing AReaL, and the one
line users see when it is a release this watchdog does not know."""

from __future__ import annotations

from pathlib import Path

from areal_watchdog.common.areal_version import installed_version, is_known, series, unknown_note


def test_a_version_names_its_release_series() -> None:
    assert series("2.0.3") == "2.0"
    assert series("1.0.0rc1") == "1.0"
    assert series("v2") is None and series(None) is None
    assert is_known("2.0.3") and not is_known("3.1.0") and not is_known(None)


def test_an_unknown_release_gets_one_line_naming_what_is_off() -> None:
    note = unknown_note("3.1.0", "the trainer hook is off")
    assert note == (
        "AReaL 3.1.0 is not one areal-watchdog knows (1.0.x, 2.0.x): the trainer hook is off"
    )
    assert unknown_note("2.0.1", "x") is None
    assert unknown_note(None, "x") is None  # no AReaL at all: nothing is off


def interpreter(tmp_path: Path, prints: str) -> str:
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\nprintf '{prints}'\n")
    path.chmod(0o755)
    return str(path)


def test_the_version_is_asked_of_the_jobs_interpreter(tmp_path: Path) -> None:
    assert installed_version(interpreter(tmp_path, "2.0.4\\n")) == "2.0.4"
    assert installed_version(str(tmp_path / "no-python")) is None


def test_an_interpreter_without_areal_has_no_version(tmp_path: Path) -> None:
    assert installed_version(interpreter(tmp_path, "")) is None
