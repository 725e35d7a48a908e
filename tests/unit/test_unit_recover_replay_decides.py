"""The replay that decides a resume (``recover.replay_decides``), its host a fake that answers
as a replay would (an exit code, a run directory, a report when it hung): no job runs. What the
finding says is what the policy, the record and the report carry."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from areal_watchdog.common.errors import UserError
from areal_watchdog.config.load import load_config
from areal_watchdog.launch.exit_codes import ExitCode
from areal_watchdog.recover.policy import Hang, decide
from areal_watchdog.recover.replay_decides import NO_TOKENIZER, replay_decides, tokenizer_of
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.trajectory.replay.replay_plan import ReplayRequest
from testkit.launcher import DEMO_CONFIG

SITE = "at train.py:90 in announce_metrics()"


def report(category: str, where: str, step: int | None = 3) -> dict:
    return {
        "incident_id": f"inc-{category}", "category": category, "last_step": 2,
        "culprit_ranks": [2], "ranks": [{"rank": 2, "where": where}],
        "trajectory": {"step": step} if step is not None else {},
    }  # fmt: skip


ORIGINAL = report("collective_mismatch", SITE)
HANG = Hang.from_report(ORIGINAL, "inc-1", None)


class FakeHost:
    """Answers each replay with ``code`` and, when given, the report the replay wrote."""

    where = "on the fake node"

    def __init__(self, root: Path, code: int, wrote: dict | None = None) -> None:
        self.root, self.code, self.wrote = root, code, wrote
        self.requests: list[ReplayRequest] = []

    def run(self, request: ReplayRequest) -> tuple[int, str, str]:
        self.requests.append(request)
        run_dir = self.root / f"replay{len(self.requests)}"
        if self.wrote is not None:
            incident = RunLayout(run_dir).incidents_dir / self.wrote["incident_id"]
            incident.mkdir(parents=True)
            (incident / "report.json").write_text(json.dumps(self.wrote))
        run_dir.mkdir(parents=True, exist_ok=True)
        return self.code, str(run_dir), "the replay's terminal output\n"


def decides(tmp_path: Path, host: object, hung: dict | None = ORIGINAL, *overrides: str):
    config = load_config(DEMO_CONFIG, [f"cluster.fileroot={tmp_path}", *overrides])
    out = io.StringIO()
    finding = replay_decides(config, tmp_path / "run", HANG, hung, out, host)  # type: ignore[arg-type]
    return finding, out.getvalue()


def test_nothing_is_replayed_when_the_run_dumped_no_step(tmp_path: Path) -> None:
    host = FakeHost(tmp_path, ExitCode.OK)
    assert decides(tmp_path, host, report("straggler", SITE, step=None))[0] is None
    assert decides(tmp_path, host, None)[0] is None  # no report reached the disk
    assert host.requests == []


def test_a_step_that_replays_without_hanging_is_a_transient_hang(tmp_path: Path) -> None:
    host = FakeHost(tmp_path, ExitCode.OK)
    finding, said = decides(tmp_path, host)
    assert finding is not None and not finding.same_hang and not finding.stop
    assert finding.note == (
        "the dumped step 3 replayed on one node without hanging (exit code 0): the hang did not "
        "follow the data, so it is taken as transient"
    )
    (request,) = host.requests
    assert (request.run_dir, request.step, request.groups) == (tmp_path / "run", 3, None)
    assert "++watchdog.on_hang=cancel" in request.overrides  # watched, never resumed itself
    assert "replaying step 3 (the whole batch) on the fake node, watched" in said
    (replayed,) = finding.replays
    assert replayed.as_dict()["hung"] is False and replayed.as_dict()["groups"] is None
    log = Path(replayed.run_dir) / "areal-launch.log"
    assert log.read_text() == "the replay's terminal output\n"
    resumed = decide([HANG], 3, 10, finding.note, finding.stop)
    assert resumed.resume and finding.note in resumed.reason


def test_a_replay_that_fails_or_cannot_start_tells_nothing(tmp_path: Path) -> None:
    finding, _ = decides(tmp_path, FakeHost(tmp_path, ExitCode.JOB_FAILED))
    assert finding is not None and not finding.same_hang
    assert finding.note.startswith("the replay of the dumped step 3 failed (exit code 1) (")
    assert finding.note.endswith("/areal-launch.log): it tells nothing, so the hang is taken as "
                                 "transient")  # fmt: skip

    class Broken(FakeHost):
        def run(self, request: ReplayRequest) -> tuple[int, str, str]:
            raise UserError("the dump of step 3 is incomplete")

    finding, said = decides(tmp_path, Broken(tmp_path, 0))
    assert finding is not None and not finding.same_hang
    assert "  cannot replay: the dump of step 3 is incomplete" in said
    assert finding.replays[0].as_dict()["error"] == "the dump of step 3 is incomplete"
    assert "failed (exit code 2): it tells nothing" in finding.note  # no log to point at


def test_a_replay_that_hangs_another_way_leaves_the_original_transient(tmp_path: Path) -> None:
    other = report("straggler", "at model.py:3 in forward()")
    finding, said = decides(tmp_path, FakeHost(tmp_path, ExitCode.HANG_CANCELLED, other))
    assert finding is not None and not finding.same_hang
    assert "hangs another way (straggler (culprit ranks 2 at model.py:3 in forward()), step 2)" in (
        finding.note
    )
    assert "hung: straggler" in said


def test_the_same_hang_without_a_tokenizer_stops_the_resumes(tmp_path: Path) -> None:
    """The hang follows the data, but its rows cannot be named: a resume would hang again."""
    again = {**report("collective_mismatch", "at train.py:91 in announce_metrics()"),
             "incident_id": "inc-replay"}  # fmt: skip
    finding, _ = decides(tmp_path, FakeHost(tmp_path, ExitCode.HANG_CANCELLED, again))
    assert finding is not None and finding.same_hang and finding.stop
    assert finding.note == ("the dumped step 3 hangs the same way when replayed on one node: the "
                            f"hang follows the data, but {NO_TOKENIZER}")  # fmt: skip
    assert finding.replays[0].as_dict()["hang"].startswith("collective_mismatch (culprit ranks 2")
    stopped = decide([HANG], 3, 10, finding.note, finding.stop)
    assert not stopped.resume and NO_TOKENIZER in stopped.reason


def test_an_interrupted_replay_is_no_resume_either(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        decides(tmp_path, FakeHost(tmp_path, ExitCode.INTERRUPTED))


def test_the_tokenizer_is_tokenizer_path_else_the_actor_s_model() -> None:
    assert tokenizer_of(load_config(DEMO_CONFIG, [])) is None
    actor = load_config(DEMO_CONFIG, ["+actor.path=/models/qwen"])
    assert tokenizer_of(actor) == "/models/qwen"
    both = load_config(DEMO_CONFIG, ["+actor.path=/models/qwen", "+tokenizer_path=/tok"])
    assert tokenizer_of(both) == "/tok"
