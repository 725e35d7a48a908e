"""Diagnose benchmarks: ``areal-launch diagnose`` against PyTorch's ``torchfrtrace`` on the same
Flight Recorder dumps (recorded from real gloo hangs, tests/data/flight_recorder), and
classification of 10,000 ranks with every thread and asyncio task lists.

torchfrtrace runs three ways on each set: on the dumps as gloo wrote them; with ``pg_config``
filled in from the entries (what NCCL writes, so it can run at all); and the same with file
names whose directory listing returns another rank first (its culprit depends on that order).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from areal_watchdog.common.rankset import format_ranks
from areal_watchdog.diagnose.classify import classify
from areal_watchdog.evidence.model import BLOCKED, Evidence, Frame, RankEvidence, ThreadStack

REPO = Path(__file__).resolve().parents[1]
DUMPS = REPO / "tests" / "data" / "flight_recorder"
HEADER = (
    "dump set",
    "truth",
    "ours",
    "ok",
    "time",
    "torchfrtrace (as written)",
    "ok",
    "torchfrtrace (pg_config filled)",
    "ok",
    "time",
    "same, other file first",
    "ok",
)
DEFAULT_PG = ("0", "default_pg")  # the default process group, as the Flight Recorder names it
CULPRIT = re.compile(r"Culprit rank (\d+)|missing ranks: \{([\d, ]+)\}")


def torchfrtrace() -> list[str]:
    beside = Path(sys.executable).with_name("torchfrtrace")
    if beside.exists():
        return [str(beside)]
    return [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace"]


def run_ours(directory: Path) -> tuple[list[int], bool, float]:
    """(ranks named, tie said, wall seconds) from ``areal-launch diagnose DIR --json``."""
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "areal_watchdog.cli", "diagnose", str(directory), "--json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    verdict = json.loads(out.stdout)
    return verdict["culprit_ranks"], "tie" in verdict["summary"], time.perf_counter() - start


def run_torchfrtrace(directory: Path, prefix: str) -> tuple[list[int] | str, float]:
    """(ranks of the first finding it prints, or the error it dies with; wall seconds)."""
    start = time.perf_counter()
    out = subprocess.run(
        [*torchfrtrace(), str(directory), "--prefix", prefix],
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - start
    text = out.stdout + out.stderr
    if out.returncode != 0:
        errors = re.findall(r"^(\w+Error)\b", text, re.M)
        return (errors[-1] if errors else f"exit {out.returncode}"), elapsed
    blocks = re.split(r"\n(?=Collective sequence number|Not all ranks joining)", text)
    for block in blocks[1:] if len(blocks) > 1 else []:
        named = sorted(
            {int(a) for a, _ in CULPRIT.findall(block) if a}
            | {int(r) for _, b in CULPRIT.findall(block) if b for r in b.split(",")}
        )
        if named:
            return named, elapsed
    return [], elapsed


def fill_pg_config(source: Path, target: Path, prefix: str, world_size: int | None = None) -> None:
    """Copy the pickles under ``<prefix><rank>`` with ``pg_config`` rebuilt from the entries;
    the default group has every rank of ``world_size`` where it is given (some ranks may have
    written no dump)."""
    dumps = {int(f.name.rsplit("_", 1)[1]): pickle.loads(f.read_bytes()) for f in source.iterdir()}
    members: dict[tuple[str, str], set[int]] = {}
    for rank, dump in dumps.items():
        for entry in dump["entries"]:
            members.setdefault(tuple(entry["process_group"]), set()).add(rank)
    if world_size and DEFAULT_PG in members:
        members[DEFAULT_PG] = set(range(world_size))
    config = {
        name: {"name": name, "desc": desc, "ranks": str(sorted(ranks))}
        for (name, desc), ranks in members.items()
    }
    target.mkdir(parents=True)
    for rank, dump in dumps.items():
        (target / f"{prefix}{rank}").write_bytes(pickle.dumps({**dump, "pg_config": config}))


def other_first_prefix(directory: Path, ranks: list[int], first: int) -> str:
    """A file-name prefix whose directory listing does not start with rank ``first``."""
    for prefix in ("r", "t", "x", "dump", "trace_", "fr", "nccl_", "rank", "p", "q"):
        probe = directory / f"probe-{prefix}"
        probe.mkdir()
        for rank in ranks:
            (probe / f"{prefix}{rank}").touch()
        listed = os.listdir(probe)
        shutil.rmtree(probe)
        if listed and listed[0] != f"{prefix}{first}":
            return prefix
    return "rank_"


def verdict_cell(named: list[int] | str, tie: bool = False) -> str:
    if isinstance(named, str):
        return f"error: {named}"
    text = format_ranks(named) or "none"
    return f"{text} (tie)" if tie else text


def judge(named: list[int] | str, truth: dict, tie: bool = False) -> str:
    if isinstance(named, str):
        return "error"
    if truth.get("tie"):
        return "right" if tie and named == truth["culprit_ranks"] else "guess"
    return "right" if named == truth["culprit_ranks"] else "wrong"


def comparison_rows() -> list[tuple[str, ...]]:
    truths = json.loads((DUMPS / "truth.json").read_text())
    rows = []
    with tempfile.TemporaryDirectory(prefix="areal-bench-fr-") as tmp:
        for name, truth in truths.items():
            pickles = DUMPS / name / "pickle"
            ranks = sorted(int(f.name.rsplit("_", 1)[1]) for f in pickles.iterdir())
            named, tie, ours_s = run_ours(pickles)
            raw, _ = run_torchfrtrace(pickles, "rank_")
            filled_dir = Path(tmp) / name / "filled"
            fill_pg_config(pickles, filled_dir, "rank_")
            filled, frt_s = run_torchfrtrace(filled_dir, "rank_")
            first = int(os.listdir(filled_dir)[0].rsplit("_", 1)[1])  # what os.walk sees first
            prefix = other_first_prefix(Path(tmp) / name, ranks, first)
            fill_pg_config(pickles, Path(tmp) / name / "other", prefix)
            other, _ = run_torchfrtrace(Path(tmp) / name / "other", prefix)
            injected = name.rsplit("_r", 1)[1]
            rows.append(
                (
                    name,
                    f"tie (rank {injected} injected)"
                    if truth.get("tie")
                    else f"{truth['category']} {format_ranks(truth['culprit_ranks'])}",
                    verdict_cell(named, tie),
                    judge(named, truth, tie),
                    f"{ours_s:.2f} s",
                    verdict_cell(raw),
                    judge(raw, truth),
                    verdict_cell(filled),
                    judge(filled, truth),
                    f"{frt_s:.2f} s",
                    verdict_cell(other),
                    judge(other, truth),
                )
            )
    return rows


def synthetic(n: int, threads_per_rank: int, tasks_per_rank: int) -> Evidence:
    """AReaL-shaped ranks: MainThread serving HTTP, idle helpers, the EngineWorker in a
    collective, pending asyncio tasks; one rank in another collective."""
    torch_file = "/v/site-packages/torch/distributed/distributed_c10d.py"

    def threads(op: str, line: int) -> list[ThreadStack]:
        serving = ThreadStack(
            "MainThread",
            [
                Frame("select", "/usr/lib/python3.11/selectors.py", 415),
                Frame("serve_forever", "/usr/lib/python3.11/socketserver.py", 233),
                Frame("main", "/p/rpc_server.py", 90),
                Frame("<module>", "/p/rpc_server.py", 99),
            ],
            False,
            False,
        )
        idle = [
            ThreadStack(f"Thread-{i}", [Frame("wait", "/usr/lib/python3.11/threading.py", 327)])
            for i in range(threads_per_rank - 2)
        ]
        engine = ThreadStack(
            "EngineWorker",
            [
                Frame(op, torch_file, 1),
                Frame("train_batch", "/p/engine.py", line),
                Frame("engine_worker", "/p/rpc_server.py", 40),
                Frame("run", "/usr/lib/python3.11/threading.py", 982),
            ],
            False,
            False,
        )
        return [serving, *idle, engine]

    tasks = [
        {
            "name": f"Task-{i}",
            "pending_s": 12.5,
            "awaiting": "127.0.0.1:30000",
            "chain": [
                {"name": "arun_episode", "file": "/p/workflow.py", "line": 20},
                {"name": "agenerate", "file": "/p/remote.py", "line": 80},
            ],
        }
        for i in range(tasks_per_rank)
    ]
    ranks = [
        RankEvidence(r, f"n{r // 8}", r, r % 8, BLOCKED, "py-spy", threads("all_reduce", 5))
        for r in range(n)
    ]
    for rank in ranks:
        rank.tasks = tasks
    ranks[n // 3] = RankEvidence(n // 3, "x", 1, 0, BLOCKED, "py-spy", threads("broadcast", 7))
    return Evidence(world_size=n, ranks=ranks)


def classify_seconds(n: int, threads_per_rank: int, tasks_per_rank: int, repeat: int) -> float:
    evidence = synthetic(n, threads_per_rank, tasks_per_rank)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        verdict = classify(evidence)
        best = min(best, time.perf_counter() - start)
    assert verdict.culprit_ranks == [n // 3], verdict.summary
    return best


def run_diagnose_benchmarks(quick: bool = False) -> Iterator[tuple]:
    yield (
        "Flight Recorder dumps from real gloo hangs: areal-launch diagnose vs torchfrtrace "
        "(time: wall clock of each command)",
        comparison_rows(),
        HEADER,
    )
    repeat = 3 if quick else 5
    rows = []
    for n, threads_per_rank, tasks_per_rank in ((1_000, 4, 8), (10_000, 4, 8), (10_000, 8, 32)):
        seconds = classify_seconds(n, threads_per_rank, tasks_per_rank, repeat)
        rows.append(
            (
                f"classify {n:,} ranks x {threads_per_rank} threads, {tasks_per_rank} tasks",
                f"{seconds * 1000:.0f} ms",
                "< 2 s for 10,000",
            )
        )
    yield "Classification with every thread and asyncio task lists (synthetic)", rows


if __name__ == "__main__":
    for title, table, *header in run_diagnose_benchmarks(quick="--quick" in sys.argv):
        print(f"\n## {title}\n")
        for row in [*header, *table]:
            print(" | ".join(row))
