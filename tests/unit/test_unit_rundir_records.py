"""The records processes exchange in a run directory, as their readers see them: a heartbeat's
step read from its file name, a record that counts only for the run that wrote it, and the
newest incident report a launcher picks up after a run (or a replay)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from areal_watchdog.rundir.layout import ENV_NODE, RunLayout
from areal_watchdog.rundir.progress.beats import beat_name, beat_step, beats_node, pause_name
from areal_watchdog.rundir.run_id_check import read_run_record
from areal_watchdog.rundir.sidecar_files.incidents import newest_report


def test_a_heartbeat_name_carries_the_step_back_to_its_reader() -> None:
    assert beat_step(beat_name(3, 120, "20261127-ab.12"), "20261127-ab.12") == 120
    assert beat_step(beat_name(0, -1, "r1"), "r1") == -1
    assert beat_step(beat_name(0, None, "r1"), "r1") is None  # started, no step yet


def test_a_heartbeat_of_another_run_or_another_file_tells_no_step() -> None:
    assert beat_step(beat_name(3, 120, "old-run"), "r1") is None  # a stale beat from a crash
    assert beat_step(pause_name(3), "r1") is None
    assert beat_step("rank_3.step_12", "r1") is None


def test_writer_and_reader_name_the_same_heartbeat_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    monkeypatch.setenv(ENV_NODE, "node-a")
    assert beats_node() == "node-a"
    monkeypatch.setenv("SLURMD_NODENAME", "slurm-7")  # Slurm's name wins over the inherited one
    assert beats_node() == "slurm-7"


def test_a_record_counts_only_for_the_run_that_wrote_it(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    path.write_text(json.dumps({"run_id": "r1", "step": 7}))
    assert read_run_record(path, "r1") == {"run_id": "r1", "step": 7}
    assert read_run_record(path, "r2") is None
    path.write_text('["run_id", "r1"]')  # valid JSON, not a record
    assert read_run_record(path, "r1") is None
    path.write_text('{"run_id": "r1", ')  # half-written
    assert read_run_record(path, "r1") is None
    assert read_run_record(tmp_path / "missing.json", "r1") is None


def report(layout: RunLayout, incident: str, when: float, text: str | None = None) -> None:
    path = layout.incidents_dir / incident / "report.json"
    path.parent.mkdir(parents=True)
    path.write_text(text if text is not None else json.dumps({"incident_id": incident}))
    os.utime(path, (when, when))


def test_the_launcher_picks_the_newest_report_written_since_the_run_began(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    assert newest_report(layout, since=0) == (None, None)
    report(layout, "old", when=1_000)
    report(layout, "first", when=2_000)
    report(layout, "second", when=2_500)
    assert newest_report(layout, since=1_500) == ("second", {"incident_id": "second"})
    assert newest_report(layout, since=3_000) == (None, None)  # the old run's reports don't count


def test_a_report_that_cannot_be_read_is_still_named(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    report(layout, "torn", when=2_000, text='{"incident_id": ')
    assert newest_report(layout, since=0) == ("torn", None)
