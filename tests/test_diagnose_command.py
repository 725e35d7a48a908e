"""``areal-launch diagnose PATH``: Flight Recorder dumps recorded from real gloo hangs (pickle as
NCCL writes them, JSON, onlyActive) and incident directories, classified after the fact."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from areal_watchdog.diagnose.classify import classify
from areal_watchdog.evidence import offline
from conftest import REPO

DUMPS = Path(__file__).parent / "data" / "flight_recorder"
TRUTH = json.loads((DUMPS / "truth.json").read_text())
EVIDENCE = Path(__file__).parent / "data" / "evidence"
CASES = [(name, fmt) for name in sorted(TRUTH) for fmt in ("pickle", "json", "active")]


def diagnose(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "areal_watchdog.cli", "diagnose", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


@pytest.mark.parametrize(("name", "fmt"), CASES, ids=[f"{n}-{f}" for n, f in CASES])
def test_recorded_dumps_name_the_truth(name: str, fmt: str) -> None:
    found = offline.load(DUMPS / name / fmt)
    verdict = classify(found.evidence)
    truth = TRUTH[name]
    assert (verdict.category, verdict.culprit_ranks) == (truth["category"], truth["culprit_ranks"])
    assert ("tie" in verdict.summary) == truth.get("tie", False), verdict.summary
    assert sorted(found.files) == list(range(found.evidence.world_size))


def test_json_output_is_one_object_with_the_verdict() -> None:
    result = diagnose(str(DUMPS / "moe_w4_r3" / "pickle"), "--json")
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)  # one object, nothing else on stdout
    assert verdict["category"] == "straggler" and verdict["culprit_ranks"] == [3]
    assert 0 < verdict["confidence"] <= 1 and "rank 3" in verdict["summary"]
    assert verdict["source"]["kind"] == "flight_recorder"
    assert all(g["kind"] != "mismatch" for g in verdict["collectives"]["groups"])


def test_text_output_names_category_and_ranks() -> None:
    result = diagnose(str(DUMPS / "mismatch_w4_r2" / "json"))
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith("collective_mismatch: culprit ranks 2,")
    assert "rank 2 issued broadcast" in result.stdout


def test_an_incident_directory_is_classified_again(tmp_path: Path) -> None:
    incident = tmp_path / "incident"
    incident.mkdir()
    shutil.copy(EVIDENCE / "collective_mismatch_w4_r2--worker.json", incident / "evidence.json")
    result = diagnose(str(incident), "--json")
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)
    assert (verdict["category"], verdict["culprit_ranks"]) == ("collective_mismatch", [2])
    assert verdict["source"]["kind"] == "incident"
    assert "thread EngineWorker" in verdict["summary"]


@pytest.mark.parametrize("make", ["missing", "empty", "not_dumps", "error_record", "bad_evidence"])
def test_bad_paths_are_one_line_errors(tmp_path: Path, make: str) -> None:
    target = tmp_path / "x"
    if make != "missing":
        target.mkdir()
    if make == "not_dumps":
        (target / "notes.txt").write_text("hello")
        os.mkfifo(target / "trigger_rank_0")  # never opened: it would block
    if make == "error_record":  # what the listener writes when torch.distributed is not up
        (target / "fr_rank_0.json").write_text(json.dumps({"rank": 0, "error": "RuntimeError"}))
    if make == "bad_evidence":
        (target / "evidence.json").write_text("{not json")
    result = diagnose(str(target))
    assert result.returncode == 2
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"areal-launch: error: {target}")


class _Exploit:
    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_would_run_code_is_refused(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    exploit = _Exploit()
    exploit.marker = tmp_path / "pwned"
    (dumps / "rank_0").write_bytes(pickle.dumps(exploit))
    result = diagnose(str(dumps))
    assert result.returncode == 2 and "no Flight Recorder dump" in result.stderr
    assert not exploit.marker.exists()


def test_two_dumps_of_one_rank_keep_the_newest(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    shutil.copytree(DUMPS / "mismatch_w4_r2" / "pickle", dumps)
    stale = json.loads((DUMPS / "moe_w4_r3" / "json" / "rank_2.json").read_text())
    (dumps / "rank_2.json").write_text(json.dumps({"rank": 2, "trace": stale}))
    os.utime(dumps / "rank_2.json", (1, 1))  # older than the pickle
    found = offline.load(dumps)
    assert found.files[2] == "rank_2"
    assert classify(found.evidence).culprit_ranks == [2]


@pytest.mark.parametrize("name", ["moe_w4_r3", "pairs_w4_r3"])
@pytest.mark.parametrize("nccl", [False, True], ids=["gloo", "nccl-pg-config"])
def test_ranks_whose_dump_holds_no_collective_are_the_culprits(
    tmp_path: Path, name: str, nccl: bool
) -> None:
    """Real dumps in which ranks 1 and 3 never issued a collective (GIL-locked ranks: their
    dump files exist, with no entry): they are the culprits, and their dumps are no "missing
    dump". ``nccl``: ``pg_config`` lists the members, as NCCL's dumps do."""
    for source in (DUMPS / name / "pickle").iterdir():
        trace = pickle.loads(source.read_bytes())
        if nccl:
            trace["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}}
        if source.name in ("rank_1", "rank_3"):
            trace["entries"] = []
            never = {"last_enqueued_collective": -1, "last_completed_collective": -1}
            trace["pg_status"] = {pg: dict(never) for pg in trace["pg_status"]}
        (tmp_path / source.name).write_bytes(pickle.dumps(trace))
    result = diagnose(str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)
    assert (verdict["category"], verdict["culprit_ranks"]) == ("straggler", [1, 3])
    assert "never issued collective #1" in verdict["summary"]
    assert "No dump from" not in verdict["summary"]


def test_a_deeply_nested_evidence_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "evidence.json").write_text("[" * 100_000)
    result = diagnose(str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert "not a readable evidence file" in line
