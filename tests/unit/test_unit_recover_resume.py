"""``on_hang: resume`` after the report (``recover.resume``): the loop over a fake backend whose
attempts end as scripted (a hang, with its report on disk, or the end), what it records in
``recovery.json`` and the hang's report, the resumed plan it asks for, and what ``status`` and
the report's "Recovery" paragraph show of a recorded run. No job runs."""

from __future__ import annotations

import io
import json
import socket
from pathlib import Path

from areal_watchdog.config.load import load_config
from areal_watchdog.config.model import HangAction, JobConfig
from areal_watchdog.launch.exit_codes import ExitCode
from areal_watchdog.launch.planning.plan import LaunchPlan, ProcessSpec
from areal_watchdog.launch.recovery import Recovery
from areal_watchdog.recover.checks import ENV_ATTEMPT, ENV_LAST_STEP
from areal_watchdog.recover.resume import recovery_lines, recovery_markdown, run_resuming
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.sidecar_files.hang_request import HangRequest
from testkit.launcher import DEMO_CONFIG

SITE = "at train.py:90 in announce_metrics()"


class LeavesOut(Recovery):
    """A scheduler's answers: every node a hang named can be left out of the next attempt."""

    left_out: list[set[str]]

    def known_nodes(self, named: set[str]) -> set[str]:
        return set(named)

    def leaves_out_nodes(self) -> bool:
        return True

    def without_nodes(self, config: JobConfig, nodes: set[str]) -> JobConfig:
        self.left_out.append(set(nodes))
        return config

    def allocation(self) -> str:
        return "new"


class FakeBackend:
    """Each ``execute`` ends as the next scripted code; a hang leaves its report and request
    as a sidecar would."""

    name = "fake"

    def __init__(self, codes: list[int]) -> None:
        self.recovery = LeavesOut()
        self.recovery.left_out = []
        self.codes = codes
        self.planned: list[JobConfig] = []
        self.released = False

    def plan(self, config: JobConfig, watchdog: bool, run_id: str | None = None) -> LaunchPlan:
        self.planned.append(config)
        layout = RunLayout(config.run_dir)
        reset = [str(layout.recovery_file), str(layout.cancel_file)]
        job = [ProcessSpec("job", ["true"])]
        return LaunchPlan(self.name, f"r{len(self.planned)}", str(layout.run_dir), {}, job,
                          reset_paths=reset)  # fmt: skip

    def execute(self, plan: LaunchPlan, out: io.StringIO) -> int:
        code = self.codes.pop(0)
        if code == ExitCode.HANG_CANCELLED:
            layout = RunLayout(Path(plan.run_dir))
            incident = layout.incidents_dir / f"inc-{plan.run_id}"
            incident.mkdir(parents=True)
            report = {"incident_id": incident.name, "category": "collective_mismatch",
                      "last_step": 3, "culprit_ranks": [2], "ranks": [{"rank": 2, "where": SITE}],
                      "culprit_nodes": ["node7"], "unanswered_nodes": [socket.gethostname()],
                      "detected_at": "2026-11-27T00:00:00+00:00", "job": {}}  # fmt: skip
            (incident / "report.json").write_text(json.dumps(report))
            (incident / "report.md").write_text("# Hang\n")
            HangRequest(plan.run_id, incident.name, HangAction.RESUME, 1.0).write(layout)
        return code

    def release(self) -> None:
        self.released = True


def resuming(tmp_path: Path, codes: list[int]) -> tuple[int, FakeBackend, RunLayout, str]:
    config = load_config(DEMO_CONFIG, [f"cluster.fileroot={tmp_path}", "watchdog.on_hang=resume",
                                       "+watchdog.resume.backoff=0"])  # fmt: skip
    RunLayout(config.run_dir).watch_dir.mkdir(parents=True)
    backend = FakeBackend(codes)
    out = io.StringIO()
    code = run_resuming(backend, config, backend.plan(config, watchdog=True), out)  # type: ignore[arg-type]
    return code, backend, RunLayout(config.run_dir), out.getvalue()


def test_a_transient_hang_is_resumed_without_its_node_and_the_run_completes(
    tmp_path: Path,
) -> None:
    code, backend, layout, said = resuming(tmp_path, [ExitCode.HANG_CANCELLED, ExitCode.OK])
    assert code == ExitCode.OK and backend.released
    assert "[areal-launch] resume 1 of 3 after collective_mismatch (culprit ranks 2 " in said
    assert said.endswith("[areal-launch] after 1 resume(s) the job completed\n")
    resumed = backend.planned[-1]  # the second plan: the resume variables, node7 left out
    # (never this host: it runs the launcher, not the job's ranks)
    assert backend.recovery.left_out == [{"node7"}]
    assert resumed.launch.env[ENV_ATTEMPT] == "1" and resumed.launch.env[ENV_LAST_STEP] == "3"
    assert resumed.launch.env == {**backend.planned[0].launch.env, ENV_ATTEMPT: "1",
                                  ENV_LAST_STEP: "3"}  # fmt: skip
    record = json.loads(layout.recovery_file.read_text())
    (entry,) = record["attempts"]
    assert (entry["decision"], entry["step"], entry["nodes_excluded"]) == ("resume", 3, ["node7"])
    assert entry["allocation"] == "new" and entry["replay"] is None  # no dumped step
    assert record["outcome"] == "completed" and record["max_attempts"] == 3
    report = json.loads((layout.incidents_dir / "inc-r1" / "report.json").read_text())
    assert report["recovery"]["decision"] == "resume" and report["recovery"]["attempt"] == 1
    assert (
        "## Recovery\n\nHang 1 (at most 3 resumes): resume 1 of 3"
        in (layout.incidents_dir / "inc-r1" / "report.md").read_text()
    )
    lines = recovery_lines(layout.run_dir)
    assert lines[0] == "  resumes (on_hang: resume, at most 3):"
    assert lines[1].startswith("    hang 1: collective_mismatch (culprit ranks 2 at train.py:90")
    lost = entry["time_lost_s"]
    assert lines[1].endswith(f", step 3: resume, time lost {lost} s, nodes excluded node7, "
                             "allocation new")  # fmt: skip
    assert lines[2] == "    outcome: completed"


def test_the_same_hang_after_a_resume_stops_with_exit_3_and_says_why(tmp_path: Path) -> None:
    code, backend, layout, said = resuming(tmp_path, [ExitCode.HANG_CANCELLED] * 2)
    assert code == ExitCode.HANG_CANCELLED and backend.released and len(backend.planned) == 2
    assert "the same hang came back after a resume" in said
    record = json.loads(layout.recovery_file.read_text())  # kept across the resumed plan
    assert [e["decision"] for e in record["attempts"]] == ["resume", "stop"]
    assert record["outcome"].startswith("stopped: the same hang came back after a resume")
    assert recovery_lines(layout.run_dir)[-1].startswith("    outcome: stopped: the same hang")


def test_a_run_that_never_hangs_records_nothing(tmp_path: Path) -> None:
    code, backend, layout, said = resuming(tmp_path, [ExitCode.JOB_FAILED])
    assert code == ExitCode.JOB_FAILED and backend.released and said == ""
    assert not layout.recovery_file.exists() and recovery_lines(layout.run_dir) == []


def test_status_shows_a_recorded_run_s_resumes_and_a_damaged_record_shows_question_marks(
    tmp_path: Path,
) -> None:
    layout = RunLayout(tmp_path)
    layout.watch_dir.mkdir()
    layout.recovery_file.write_text("{not json")
    assert recovery_lines(tmp_path) == []
    entry = {"attempt": 1, "hang": "straggler (culprit ranks 1), step 4", "decision": "resume",
             "replays": [{}, {}, {}], "rows_skipped": [{"step": 4, "group": 3, "prompt": "p"}],
             "rows_left_out": 0, "allocation": "same (job 41)"}  # fmt: skip
    layout.recovery_file.write_text(json.dumps({"attempts": [entry, "torn"], "outcome": None}))
    assert recovery_lines(tmp_path) == [
        "  resumes (on_hang: resume, at most ?):",
        "    hang 1: straggler (culprit ranks 1), step 4: resume, 3 replay(s), 1 row(s) "
        "quarantined, 0 row(s) removed from the data by the resumed run, allocation same (job 41)",
        "    hang ?: ?: ?",
    ]


def test_the_report_s_recovery_paragraph_says_what_the_replays_and_the_bisection_found() -> None:
    section = {
        "attempt": 2, "max_attempts": 3, "reason": "resume 2 of 3 after a hang",
        "replays": [
            {"groups": None, "hung": True, "hang": "workflow_stuck (...), step 4",
             "exit_code": 3, "seconds": 9.5, "run_dir": "/r/replay1"},
            {"groups": [0], "groups_of": 3, "hung": False, "exit_code": 0, "seconds": 4.0,
             "run_dir": "/r/replay2"},
            {"groups": [1], "error": "the dump is incomplete"},
        ],
        "narrowed": {"groups": 8, "to": [5], "replays": 4},
        "rows_skipped": [{"step": 4, "group": 5, "prompt": "What is 2+2?"}],
        "rows_left_out": 1,
    }  # fmt: skip
    said = recovery_markdown(section)
    assert said.startswith("## Recovery\n\nHang 2 (at most 3 resumes): resume 2 of 3 after a hang.")
    assert ("- the whole batch: hung: workflow_stuck (...), step 4 (exit code 3, 9.5 s), "
            "`/r/replay1`") in said  # fmt: skip
    assert "- groups [0] of step 3 (which trained): no hang (exit code 0, 4.0 s)" in said
    assert "- groups [1]: never started: the dump is incomplete" in said
    assert "Bisection: 4 replay(s) narrowed the 8 groups to 1: groups [5]." in said
    assert "- step 4, group 5: `'What is 2+2?'`" in said
    assert "The resumed run's filter removed 1 row(s)" in said
    unnarrowed = recovery_markdown({**section, "narrowed": {"groups": 2, "to": [0, 1],
                                                            "replays": 2}})  # fmt: skip
    assert "Bisection: 2 replay(s) could not narrow the 2 groups." in unnarrowed
    keyed = recovery_markdown({**section, "narrowed": {"groups": 2, "to": [0], "replays": 3,
                                                       "step_keyed": True}})  # fmt: skip
    assert "the hang follows the step, nothing is quarantined." in keyed
