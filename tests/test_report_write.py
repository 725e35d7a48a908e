"""The incident directory as users and other users meet it: the contract (report.json against
its schema), who may read each file, and no secret in any of them."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import jsonschema
import pytest

from areal_watchdog.common.secrets.redact import Redactor
from areal_watchdog.config.load import load_config
from areal_watchdog.config.model import ON_HANG_ACTIONS
from areal_watchdog.diagnose.classify import classify
from areal_watchdog.evidence.model import EXITED, Evidence, ExitInfo, RankEvidence
from areal_watchdog.evidence.trigger import Trigger
from areal_watchdog.report.build import IncidentContext, build_report, load_schema
from areal_watchdog.report.sample import sample_report
from areal_watchdog.report.write import write_incident
from testkit.launcher import DEMO_CONFIG

EXTRA_API_KEY = "launch-env-value-0123456789"
# One line per form the brief names; each must leave no trace in any file we write.
SECRET_LINES = {
    "password=hunter2-long-pass": "hunter2-long-pass",
    "cloning ghp_abcdefghijklmnopqrstuvwx0123": "ghp_abcdefghijklmnopqrstuvwx0123",
    "pat github_pat_11ABCDEFG0123456789_abcdefghijklmnop": "github_pat_11ABCDEFG0123456789",
    "slack xoxb-1234567890-abcdefghijkl": "xoxb-1234567890-abcdefghijkl",
    "user xoxp-1234567890-abcdefghijkl": "xoxp-1234567890-abcdefghijkl",
    "openai sk-proj-abcdefghijklmnopqrstuvwx": "sk-proj-abcdefghijklmnopqrstuvwx",
    "aws AKIAIOSFODNN7EXAMPLE": "AKIAIOSFODNN7EXAMPLE",
    "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY": "wJalrXUtnFEMI/K7MDENG",
    "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig": "eyJhbGciOiJIUzI1NiJ9",
    f"env EXTRA_API_KEY={EXTRA_API_KEY}": EXTRA_API_KEY,
    f"echo {EXTRA_API_KEY} in free text": EXTRA_API_KEY,
}


def crash_evidence() -> Evidence:
    """Two ranks: rank 1 raised with secrets in its message, log tail and traceback."""
    log = "\n".join(["step 3 done", *SECRET_LINES])
    ranks = [
        RankEvidence(0, "node0", 100, 0, EXITED, exit=ExitInfo(0, "returned"), log_tail="ok"),
        RankEvidence(
            1,
            "node0",
            101,
            1,
            EXITED,
            exit=ExitInfo(
                1,
                "exception",
                exc_type="RuntimeError",
                message=f"login failed password=hunter2-long-pass key {EXTRA_API_KEY}",
                traceback=f'File "/w/train.py", line 9, in main\nRuntimeError: {EXTRA_API_KEY}',
            ),
            log_tail=log,
        ),
    ]
    return Evidence(world_size=2, ranks=ranks, job_failed=True)


def write(run_dir: Path, evidence: Evidence) -> Path:
    verdict = classify(evidence)
    ctx = IncidentContext("local", "rid", str(run_dir), 2, ["node0"], "exp", "t1")
    ctx.trigger, ctx.action = Trigger.JOB_FAILED, "report"
    # As the sidecar does: the ranks' own secret-looking variables (launch.env) join the rest.
    redactor = Redactor.from_environment({"EXTRA_API_KEY": EXTRA_API_KEY})
    report = redactor.scrub_tree(
        build_report("20261122T000000Z-rank_crashed-abcd", verdict, evidence, ctx)
    )
    return write_incident(run_dir, report, evidence, redactor)


def test_schema_names_every_trigger_and_action_and_a_report_validates() -> None:
    schema = load_schema()["properties"]
    assert set(schema["trigger"]["enum"]) == {t.value for t in Trigger}
    assert set(schema["action"]["enum"]) == set(ON_HANG_ACTIONS)
    report = sample_report(load_config(DEMO_CONFIG))
    jsonschema.validate(report, load_schema())
    assert report["trigger"] == "stall" and report["action"] == "report"


def test_a_trigger_that_is_not_one_is_refused() -> None:
    evidence = crash_evidence()
    ctx = IncidentContext("local", "rid", "/runs/x", 2, ["node0"], trigger="node_lost")
    with pytest.raises(ValueError, match="node_lost"):  # a category, not a trigger
        build_report("20261122T000000Z-rank_crashed-abcd", classify(evidence), evidence, ctx)


def test_no_secret_reaches_any_file_of_the_incident(tmp_path: Path) -> None:
    incident = write(tmp_path, crash_evidence())
    files = [p for p in incident.rglob("*") if p.is_file()]
    names = {p.relative_to(incident).as_posix() for p in files}
    assert {"report.json", "report.md", "evidence.json", "logs/rank_1.txt"} <= names
    assert "step 3 done" in (incident / "logs" / "rank_1.txt").read_text()  # the tail is there
    for path in files:
        text = path.read_text()
        for secret in SECRET_LINES.values():
            assert secret not in text, f"{path.name} holds {secret}"
    jsonschema.validate(json.loads((incident / "report.json").read_text()), load_schema())


def modes(incident: Path) -> dict[str, int]:
    paths = [incident.parent, incident, *incident.rglob("*")]
    return {
        p.relative_to(incident.parent).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in paths
    }


@pytest.mark.parametrize(
    ("run_dir_mode", "dirs", "files"), [(0o700, 0o700, 0o600), (0o750, 0o750, 0o640)]
)
def test_incident_files_are_never_readable_by_others_whatever_the_umask(
    tmp_path: Path, run_dir_mode: int, dirs: int, files: int
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_dir.chmod(run_dir_mode)
    old = os.umask(0)
    try:
        incident = write(run_dir, crash_evidence())
    finally:
        os.umask(old)
    found = modes(incident)
    for name, mode in found.items():
        is_dir = (incident.parent / name).is_dir()
        assert mode == (dirs if is_dir else files), f"{name}: {oct(mode)}"
    assert len(found) >= 8


def test_a_planted_symlink_in_the_incident_path_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    (run_dir / "incidents").symlink_to(elsewhere)
    with pytest.raises(OSError):
        write(run_dir, crash_evidence())
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o755 and list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("line", ["a." * 20_000, "x" * 40_000, "token" * 8_000, "h://" * 10_000])
def test_scrubbing_a_long_line_takes_linear_time(line: str) -> None:
    """Log tails are read up to 64 KB: before, 10 KB of 'a.a.a.' took 11 s and 40 KB three
    minutes, holding the sidecar while it wrote the incident."""
    worker = threading.Thread(
        target=Redactor(["sup3rs3cretvalue"]).scrub, args=(line * 25,), daemon=True
    )
    worker.start()
    worker.join(5.0)
    assert not worker.is_alive(), "a 1 MB line took more than 5 s to scrub"


def test_a_report_of_thousands_of_ranks_lists_the_few_and_links_every_node(tmp_path: Path) -> None:
    """At 1,024 nodes x 8 ranks every rank's entry made a 4.4 MB report.json (and webhook
    payload): past 256 ranks it lists the culprits, the first rank of every stack group and
    the exited, and one file per node holds every rank."""
    from areal_watchdog.report.bound import split_ranks

    entry = {"state": "blocked", "where": "all_reduce at t.py:9", "frames": [{"name": "f"}] * 20}
    ranks = [{"rank": r, "node": f"node{r // 8:04d}", "pid": r, **entry} for r in range(8192)]
    ranks[77]["state"] = "exited"
    report = {"ranks": ranks, "culprit_ranks": [9], "groups": [{"ranks": [0, 1]}, {"ranks": [5]}],
              "files": {"incident_dir": "/runs/i"}}  # fmt: skip
    summary, by_node = split_ranks(report)
    assert [r["rank"] for r in summary["ranks"]] == [0, 5, 9, 77]
    assert summary["ranks_total"] == 8192 and len(by_node) == 1024 and len(by_node["node0001"]) == 8
    assert summary["files"]["ranks_by_node"] == "/runs/i/ranks/<node>.json"
    small = {**report, "ranks": ranks[:256]}
    assert split_ranks(small) == (small, {})
