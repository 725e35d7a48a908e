"""The leader's incident desk (``watch.silence.incident_desk``) driven with recorded evidence: the
real ``Incidents`` with only its gathering replaced, a real run directory under tmp_path, a fake
notifier. What users see: the report written and posted, the line said, the cancel recorded and
sent to the launcher's pipe (or to the scheduler's command), secrets kept out."""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from areal_watchdog.common.atomic import write_json_atomic
from areal_watchdog.common.secrets.redact import Redactor
from areal_watchdog.config.model import HangAction, WatchdogSection
from areal_watchdog.evidence.model import Evidence
from areal_watchdog.evidence.trigger import Trigger
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import ENV_CANCEL_FD
from areal_watchdog.rundir.sidecar_files.hang_request import HangRequest
from areal_watchdog.watch.cluster.coordination import Coordinator
from areal_watchdog.watch.progress.stall_clock import StallClock
from areal_watchdog.watch.silence.incident_desk import Incidents, job_secrets, look_outcome
from conftest import sleeper

DATA = Path(__file__).resolve().parents[1] / "data" / "evidence"
SECRET = "Zq8vLm3xPw7Rk"  # no secret-looking word: only the environment tells


def recorded(name: str) -> Evidence:
    return Evidence.from_dict(json.loads((DATA / f"{name}.json").read_text()))


class FakeNotifier:
    """What the desk hands the sinks: the reports, as submitted."""

    def __init__(self) -> None:
        self.redactor = Redactor()
        self.sent: list[dict[str, Any]] = []

    def submit(self, report: dict[str, Any]) -> None:
        self.sent.append(report)


@dataclass
class FakeWatch:
    """The node's processes, as far as the desk asks: their pids (for their secrets)."""

    live_pids: list[int] = field(default_factory=list)

    def pids(self) -> list[int]:
        return self.live_pids


@dataclass
class Desk(Incidents):
    """The real incident desk; each gathering returns the next recorded evidence."""

    looks: list[Evidence] = field(default_factory=list)

    def gather(self, trigger: Trigger, lost: list[str], statuses: dict) -> tuple[Evidence, float]:
        evidence = self.looks.pop(0) if len(self.looks) > 1 else self.looks[0]
        return copy.deepcopy(evidence), 0.0


def info(run_dir: Path, on_hang: str = "cancel", command: list[str] | None = None) -> LaunchInfo:
    return LaunchInfo(
        run_id="r1", backend="local", run_dir=str(run_dir), world_size=2, nodes=["n1"],
        nproc_per_node=2, experiment_name="e", trial_name="t", fileroot=str(run_dir),
        watchdog=WatchdogSection(on_hang=on_hang, confirm_after=10.0),
        scheduler_command=command,
    )  # fmt: skip


def desk(
    run_dir: Path, *looks: Evidence, on_hang: str = "cancel", command: list[str] | None = None,
    job_id: str | None = None, pids: list[int] | None = None,
) -> tuple[Desk, list[str]]:  # fmt: skip
    launch = info(run_dir, on_hang, command)
    launch.layout.watch_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(launch.layout.launch_file, launch.to_dict())  # as the launcher does
    lines: list[str] = []
    clock = StallClock(30.0, 60.0, started_at=0.0)
    clock.step(3, 0.0)
    d = Desk(
        launch, "n1", ["n1"], job_id, FakeWatch(pids or []),  # type: ignore[arg-type]
        Coordinator(launch.layout, "r1", "n1", ["n1"]), clock,
        FakeNotifier(), lines.append, looks=list(looks),  # type: ignore[arg-type]
    )  # fmt: skip
    return d, lines


@pytest.fixture
def launcher_pipe(monkeypatch: pytest.MonkeyPatch):
    """The pipe the local launcher gives its sidecar; yields a function reading what came."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    monkeypatch.setenv(ENV_CANCEL_FD, str(write))

    def heard() -> list[HangRequest]:
        try:
            return HangRequest.heard(os.read(read, 65536).decode())
        except BlockingIOError:
            return []

    try:
        yield heard
    finally:
        os.close(read)
        os.close(write)


def reports(run_dir: Path, folder: str = "incidents") -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((run_dir / folder).glob("*/report.json"))]


def test_a_crashed_rank_is_reported_posted_and_the_launcher_asked_to_cancel(
    tmp_path: Path, launcher_pipe
) -> None:
    d, lines = desk(tmp_path, recorded("rank_crashed_w2_r1"))
    d.open(Trigger.RANK_EXITED, {})
    (report,) = reports(tmp_path)
    assert (report["category"], report["culprit_ranks"]) == ("rank_crashed", [1])
    assert (report["trigger"], report["action"], report["last_step"]) == (
        "rank_exited",
        "cancel",
        3,
    )
    assert report["job"]["run_id"] == "r1"
    assert [r["incident_id"] for r in d.notifier.sent] == [report["incident_id"]]
    request = HangRequest.read(d.info.layout)
    assert request is not None
    assert (request.run_id, request.incident_id, request.action) == (
        "r1", report["incident_id"], HangAction.CANCEL
    )  # fmt: skip
    assert launcher_pipe() == [request]
    assert any(line.startswith("report written: ") and "rank_crashed" in line for line in lines)
    assert lines[-1] == "on_hang=cancel: asking the launcher to terminate the job"
    assert d.cancelling
    # what the metrics count (areal_watchdog_looks_total, areal_watchdog_incidents_total)
    assert (d.look_outcomes, d.posted_kinds) == ({"posted": 1}, {"rank_crashed": 1})


def test_on_hang_report_writes_and_posts_but_never_cancels(tmp_path: Path, launcher_pipe) -> None:
    """A silence is followed as under ``on_hang: cancel`` (posted once a second look confirms
    it: a slow phase is never posted at its first look), and the job is left running."""
    d, lines = desk(tmp_path, recorded("collective_mismatch_w4_r2"), on_hang="report")
    d.clock.hold(time.time())  # the silence began now: the hard limit is far
    d.open(Trigger.STALL, {})
    assert reports(tmp_path) == [] and d.case is not None
    d.escalation.follow({}, d.case.due)
    (report,) = reports(tmp_path)
    assert report["confirmation"]["by"] == "second_look"
    assert report["category"] == "collective_mismatch" and report["culprit_ranks"] == [2]
    assert len(d.notifier.sent) == 1
    assert HangRequest.read(d.info.layout) is None and launcher_pipe() == []
    assert not any(line.startswith("on_hang=") for line in lines)


@pytest.mark.parametrize(
    ("post", "confirmation", "outcome"),
    [
        (True, {"warning": True}, "damage"),
        (True, {"warning": True, "livelock": {"ranks": [2]}}, "warning"),
        (True, {"warning": True, "retry_loop": {"silent_s": 95.0}}, "warning"),
        (True, {"moved": []}, "posted"),
        (False, {"moved": ["rank 0 read or wrote 5.2 MB/s"]}, "dismissed"),
        (False, {"moved": []}, "written"),
    ],
)
def test_each_look_is_counted_by_its_outcome(post: bool, confirmation: dict, outcome: str) -> None:
    assert look_outcome(post, confirmation) == outcome


def test_one_event_is_reported_once_across_leaders(tmp_path: Path) -> None:
    """Two desks (a leader and the one that takes over) share the run's claims."""
    evidence = recorded("rank_crashed_w2_r1")
    first, _ = desk(tmp_path, evidence, on_hang="report")
    second, _ = desk(tmp_path, evidence, on_hang="report")
    first.open(Trigger.RANK_EXITED, {})
    first.open(Trigger.RANK_EXITED, {})
    second.open(Trigger.RANK_EXITED, {})
    assert len(reports(tmp_path)) == 1
    assert len(first.notifier.sent) + len(second.notifier.sent) == 1


def test_a_stall_with_provable_evidence_waits_for_a_second_look(tmp_path: Path) -> None:
    """``on_hang: cancel`` never cancels on a stack alone: the first look is followed, nothing
    is posted yet; the case holds the silence (a new open is the same silence)."""
    d, lines = desk(tmp_path, recorded("collective_mismatch_w4_r2"))
    d.open(Trigger.STALL, {})
    assert d.case is not None and not d.cancelling
    assert reports(tmp_path) == [] and d.notifier.sent == []
    assert "second look in 10 s" in lines[-1]
    d.open(Trigger.STALL, {})
    assert reports(tmp_path) == []


def test_a_silence_where_every_rank_ended_cleanly_is_no_hang(tmp_path: Path) -> None:
    ended = recorded("rank_crashed_w2_r1")
    for rank in ended.ranks:
        assert rank.exit is not None
        rank.exit.code, rank.exit.exc_type = 0, None
    d, lines = desk(tmp_path, ended)
    d.open(Trigger.STALL, {})
    assert lines == ["no new step, but every rank ended cleanly: the job is finishing, not hung"]
    assert reports(tmp_path) == [] and HangRequest.read(d.info.layout) is None


def test_a_full_disk_loses_no_cancel_and_the_report_is_written_later(
    tmp_path: Path, launcher_pipe
) -> None:
    d, lines = desk(tmp_path, recorded("rank_crashed_w2_r1"))
    (tmp_path / "incidents").write_text("not a folder")  # the report cannot be written
    d.open(Trigger.RANK_EXITED, {})
    assert any(line.startswith("cannot write the incident report") for line in lines)
    assert any(line.startswith("verdict (report not on disk yet") for line in lines)
    assert len(d.notifier.sent) == 1  # posted first: a message needs no disk
    (request,) = launcher_pipe()
    assert request.incident_id == d.notifier.sent[0]["incident_id"]
    assert not d.write_pending()  # still refused
    (tmp_path / "incidents").unlink()
    assert d.write_pending()
    (report,) = reports(tmp_path)
    assert report["incident_id"] == request.incident_id
    assert d.written == [tmp_path / "incidents" / request.incident_id]


def test_with_a_scheduler_the_cancel_goes_through_its_recorded_command(
    tmp_path: Path, launcher_pipe
) -> None:
    script = tmp_path / "scheduler.py"
    script.write_text(
        "import sys\n"
        "open(sys.argv[2] + '/scheduler.log', 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "print(f'ended job {sys.argv[3]} ({sys.argv[4]})')\n"
    )
    d, lines = desk(
        tmp_path, recorded("rank_crashed_w2_r1"), command=[sys.executable, str(script)],
        job_id="77",
    )  # fmt: skip
    d.open(Trigger.RANK_EXITED, {})
    assert lines[-1] == "on_hang=cancel: ended job 77 (cancel)"
    assert (tmp_path / "scheduler.log").read_text() == f"end-job {tmp_path} 77 cancel\n"
    request = HangRequest.read(d.info.layout)
    assert request is not None  # the scheduler ends the job; a launcher with a pipe hears it too
    assert launcher_pipe() == [request]


def test_a_scheduler_command_from_a_launch_record_others_may_write_is_never_run(
    tmp_path: Path, launcher_pipe
) -> None:
    marker = tmp_path / "ran"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    d, lines = desk(tmp_path, recorded("rank_crashed_w2_r1"), command=command, job_id="77")
    os.chmod(d.info.layout.launch_file, 0o666)
    d.open(Trigger.RANK_EXITED, {})
    assert lines[-1].startswith("on_hang=cancel: end-job refused: ")
    assert "is not this user's alone" in lines[-1]
    assert not marker.exists()


def test_the_ranks_secrets_are_read_from_their_environment_and_kept_out(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "MY_API_TOKEN": SECRET}
    proc = sleeper(env)
    try:
        assert SECRET in job_secrets([proc.pid])
        assert job_secrets([2**22 + 12345]) == []  # no such process: nothing, no error
        evidence = recorded("rank_crashed_w2_r1")
        evidence.ranks[1].log_tail = f"RuntimeError: login failed with {SECRET}"
        d, _ = desk(tmp_path, evidence, on_hang="report", pids=[proc.pid])
        d.open(Trigger.RANK_EXITED, {})
    finally:
        proc.kill()
        proc.wait()
    (incident,) = (tmp_path / "incidents").iterdir()
    written = "".join(p.read_text() for p in incident.rglob("*") if p.is_file())
    assert "login failed with" in written  # the evidence is there...
    assert SECRET not in written  # ...its secret is not
    assert SECRET not in json.dumps(d.notifier.sent)


class SlowPeers:
    """Two peers: n2 alive but answering only after the first wait (a node busy probing a
    wedged server, CI), n3 silent."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def collect(self, request_id: str, nodes: list[str], timeout: float) -> dict[str, dict]:
        self.asked.append(list(nodes))
        return {"n2": {"ranks": []}} if len(self.asked) == 2 else {}

    def read_all(self) -> dict:
        return {}

    def alive(self, node: str) -> bool:
        return node == "n2"


def test_a_peer_alive_but_slow_to_answer_is_waited_for_once_more(tmp_path: Path) -> None:
    d, lines = desk(tmp_path)
    d.coordinator = SlowPeers()  # type: ignore[assignment]
    assert d.collect("req", ["n2", "n3"]) == {"n2": {"ranks": []}}
    assert d.coordinator.asked == [["n2", "n3"], ["n2"]]  # the silent one is not waited for
    assert lines == [
        "waiting up to 10 s more for 1 node(s) that are alive but have not answered: n2"
    ]
