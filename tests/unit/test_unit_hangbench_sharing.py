"""Which HangBench tools read one run, and when one's action ends another's reading: PyTorch's
rows share a run with the shortest timeout, a longer one is read only until that timeout fires
(else it runs again alone), and a run whose tools have all signalled ends; ``--resume`` goes on
across commits that change docs or tests only."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from benchmarks.hangbench import __main__ as hangbench
from benchmarks.hangbench import runs, sharing
from benchmarks.hangbench.cases import Case, Label
from benchmarks.hangbench.runs import Launch, Run
from benchmarks.hangbench.tools import (
    TORCH_DEFAULT_S,
    TUNED_TIMEOUT_S,
    AreaLWatchdog,
    FaultTolerance,
    FlightRecorderTrace,
    Signal,
    TorchTimeout,
)

DEFAULT = TorchTimeout("torch-default", TORCH_DEFAULT_S, reach=0.0)
TUNED = TorchTimeout("torch-tuned", TUNED_TIMEOUT_S, reach=TUNED_TIMEOUT_S)
FRTRACE = FlightRecorderTrace()
TORCH = [DEFAULT, TUNED, FRTRACE]
HANG_AT = 100.0


def test_pytorchs_rows_share_a_run_and_every_other_tool_runs_alone() -> None:
    watchdog = AreaLWatchdog(None)  # type: ignore[arg-type]
    beats, sections = FaultTolerance("heartbeats"), FaultTolerance("sections")
    grouped = sharing.groups([watchdog, DEFAULT, beats, TUNED, sections, FRTRACE])
    assert [[t.name for t in g] for g in grouped] == [
        ["areal-watchdog"], ["torch-default", "torch-tuned", "torchfrtrace"],
        ["ft-heartbeats"], ["ft-sections"],
    ]  # fmt: skip


def test_the_shared_run_gets_the_shortest_timeout_whatever_the_order() -> None:
    for order in (TORCH, TORCH[::-1]):
        launch = Launch(config={})
        for tool in order:
            tool.prepare(None, launch)  # type: ignore[arg-type]
        assert launch.env["HANGBENCH_COLLECTIVE_TIMEOUT"] == "60"


def test_a_longer_timeout_is_read_until_the_shorter_fires_then_runs_alone() -> None:
    fired = HANG_AT + 60.2
    # the default's window (the case's 25 s and 5 s of grace) closed before the timeout fired
    assert not sharing.cut(DEFAULT, TORCH, None, HANG_AT + 30.0, fired)
    # a livelock's 125 s window was still open: what the default alone would have seen is unknown
    assert sharing.cut(DEFAULT, TORCH, None, HANG_AT + 125.0, fired)
    # the timeout's own error, seen by the default's reading, is no answer of its own
    assert sharing.cut(DEFAULT, TORCH, Signal(fired), HANG_AT + 125.0, fired)
    # a healthy job's window is the job: a false alarm of the tuned timeout cuts the default
    assert sharing.cut(DEFAULT, TORCH, None, None, fired)
    # an answer before the timeout fired (a rank crashed) stands
    assert not sharing.cut(DEFAULT, TORCH, Signal(HANG_AT + 2.0), HANG_AT + 125.0, fired)
    # the rows whose timeout fired are never cut: the firing is their signal
    for tool in (TUNED, FRTRACE):
        assert not sharing.cut(tool, TORCH, Signal(fired), None, fired)
    assert not sharing.cut(DEFAULT, TORCH, None, None, None)  # nothing fired


def test_the_timeout_that_fired_is_read_from_the_ranks_not_a_peers_crash(tmp_path: Path) -> None:
    run = _run_with_logs(tmp_path, {
        0: "HANGBENCH torch_error rank=0 at=170.000 RuntimeError: Connection closed by peer\n",
        1: "HANGBENCH torch_error rank=1 at=160.300 RuntimeError: [gloo] Timed out waiting "
           "60000ms for recv operation to complete\n",
        2: "Train step 3/10 done\n",
    })  # fmt: skip
    assert sharing.acted_at(run) == 160.3
    crashed = _run_with_logs(tmp_path / "crash", {
        0: "HANGBENCH torch_error rank=0 at=170.000 RuntimeError: Connection closed by peer\n"
    })  # fmt: skip
    assert sharing.acted_at(crashed) is None


def test_a_run_ends_once_every_tool_in_it_has_signalled_and_a_tail_has_passed() -> None:
    case = _case(Label(False, "straggler", (3,), after_step=3))
    now = time.time()
    lines = [(now - 10, "[RankMonServer3@host:3] Did not get subsequent heartbeat. Waited 1.6")]
    run = Run(case, Path("/r"), Path("/r/run"), now - 30, lines, None)
    assert sharing.settled([FaultTolerance("heartbeats")], run)
    run.lines[:] = [(now - 1, lines[0][1])]  # signalled a second ago: a later step may show
    assert not sharing.settled([FaultTolerance("heartbeats")], run)
    run.lines.clear()
    assert not sharing.settled([FaultTolerance("heartbeats")], run)  # no signal yet
    assert not sharing.settled(TORCH, run)  # read after the run: it lasts its window


def test_resume_goes_on_across_docs_and_tests_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    monkeypatch.setattr(runs, "REPO", repo)
    first = _commit(repo, {"docs/a.md": "1", "benchmarks/b.py": "1", "tests/t.py": "1"})
    _commit(repo, {"docs/a.md": "2", "tests/t.py": "2", "README.md": "2"})
    assert hangbench._changed_since(first) == []
    _commit(repo, {"benchmarks/b.py": "2"})
    assert hangbench._changed_since(first) == ["benchmarks/b.py"]
    assert hangbench._changed_since(first + "+")  # a run on changes of its own: never
    out = tmp_path / "out"
    out.mkdir()
    (out / "scorecard.json").write_text(f'{{"commit": "{first}", "scores": []}}')
    with pytest.raises(hangbench.ResumeError, match=r"scorecard.json was run on .*benchmarks/b.py"):
        hangbench._earlier(out)


def _case(label: Label, limit: float = 25.0) -> Case:
    return Case("c", Path("/cases/c"), "c", Path("/cases/p.py"), {}, label, limit=limit)


def _run_with_logs(folder: Path, logs: dict[int, str]) -> Run:
    for rank, text in logs.items():
        log = folder / "run" / "logs" / "attempt_0" / str(rank) / "stderr.log"
        log.parent.mkdir(parents=True)
        log.write_text(text)
    return Run(_case(Label(True)), folder, folder / "run", 0.0, [], None)


def _commit(repo: Path, files: dict[str, str]) -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip

    if not repo.exists():
        repo.mkdir()
        git("init", "-q")
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    return git("rev-parse", "--short", "HEAD")
