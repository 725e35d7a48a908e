"""The local launcher's exit code: 3 says the watchdog ended the job, never a job that ended
by itself while its crash was being posted."""

from __future__ import annotations

import io
from pathlib import Path

from areal_watchdog.common.atomic import write_json_atomic
from areal_watchdog.config.model import HangAction
from areal_watchdog.launch.exit_codes import ExitCode
from areal_watchdog.launch.local import _LocalRun
from areal_watchdog.launch.planning.plan import LaunchPlan, ProcessSpec
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.sidecar_files.hang_request import HangRequest

REPORT = {"category": "rank_crashed", "summary": "The controller failed: raised EngineCallError"}


def run_with_a_posted_crash(tmp_path: Path) -> tuple[_LocalRun, io.StringIO]:
    """A run whose sidecar posted a crash and asked for the cancel (``on_hang: cancel``)."""
    job = ProcessSpec("trainer", ["python", "train.py"])
    plan = LaunchPlan("local", "r1", str(tmp_path), {}, [job])
    out = io.StringIO()
    run = _LocalRun(plan, out)
    layout = RunLayout(tmp_path)
    (layout.incidents_dir / "i1").mkdir(parents=True)
    layout.cancel_file.parent.mkdir()
    write_json_atomic(layout.incidents_dir / "i1" / "report.json", REPORT)
    HangRequest("r1", "i1", HangAction.CANCEL, 0.0).write(layout)
    return run, out


def test_a_job_that_failed_by_itself_keeps_its_code_and_its_report_is_named(
    tmp_path: Path,
) -> None:
    run, out = run_with_a_posted_crash(tmp_path)
    assert run.exit_code(1, interrupted=False) == ExitCode.JOB_FAILED
    said = out.getvalue()
    assert "the job ended by itself; the watchdog reported: rank_crashed -- The controller" in said
    assert "job cancelled" not in said and f"{tmp_path / 'incidents' / 'i1' / 'report.md'}" in said


def test_a_job_the_launcher_ended_for_the_watchdog_exits_3(tmp_path: Path) -> None:
    run, out = run_with_a_posted_crash(tmp_path)
    run.cancelled = True
    assert run.exit_code(1, interrupted=False) == ExitCode.HANG_CANCELLED
    assert "job cancelled after a hang: rank_crashed" in out.getvalue()
