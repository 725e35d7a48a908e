"""HangBench: ``python -m benchmarks.hangbench`` runs every case under every tool and writes the
scorecard (``--only``, ``--tool``, ``--repeat`` for the impatient; ``--quick``: the chosen third
of the cases marked ``quick: true``, under areal-watchdog unless ``--tool`` says otherwise, in
under 15 minutes; docs/hangbench.md).

Each tool watches a run of its own: no tool's action (a kill, a ``SIGCONT``, a launcher in
torchrun's place) reaches another's score. A run lasts until the case's limit (or the tool's own
longer timeout) has passed since its hang, or until a healthy job ends; one that contradicts its
label scores for no tool.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.hangbench import fixtures, runs, scorecard
from benchmarks.hangbench.cases import CaseError, load_cases
from benchmarks.hangbench.tools import (
    TORCH_DEFAULT_S,
    TUNED_TIMEOUT_S,
    AreaLWatchdog,
    FaultTolerance,
    FlightRecorderTrace,
    TorchTimeout,
    available,
)
from testkit.receiver import Receiver
from testkit.slow_endpoint import SlowEndpoint

UPLOAD: SlowEndpoint  # the slow HTTP endpoint upload cases post to
GRACE_S = 5.0  # a run lasts this long past its window: a timeout set to the window is seen


def main() -> int:
    args = _parser().parse_args()
    try:
        cases = load_cases()
    except CaseError as error:
        print(f"hangbench: {error}", file=sys.stderr)
        return 2
    selected = [c for c in cases if not args.only or any(o in c.name for o in args.only.split(","))]
    selected = [c for c in selected if c.quick or not args.quick]
    if not selected:
        print(f"hangbench: no case matches --only {args.only}; see --list", file=sys.stderr)
        return 2
    if args.list:
        for case in cases:
            print(f"{case.name:32} {'quick ' if case.quick else '      '}{scorecard._label(case)}")
        return 0
    global UPLOAD
    UPLOAD = SlowEndpoint()
    receiver = Receiver("hangbench-secret")
    os.environ.update(BENCH_HOOK_URL=receiver.url(), BENCH_HOOK_SECRET="hangbench-secret")
    every = [
        AreaLWatchdog(receiver),
        TorchTimeout("torch-default", TORCH_DEFAULT_S, reach=0.0),
        TorchTimeout("torch-tuned", TUNED_TIMEOUT_S, reach=TUNED_TIMEOUT_S),
        FlightRecorderTrace(),
        FaultTolerance("heartbeats"),
        FaultTolerance("sections"),
    ]
    quick = [AreaLWatchdog.name] if args.quick else [t.name for t in every]
    names = args.tool.split(",") if args.tool else quick
    if unknown := set(names) - {t.name for t in every}:
        print(f"hangbench: unknown --tool {sorted(unknown)}; choose from "
              f"{', '.join(t.name for t in every)}", file=sys.stderr)  # fmt: skip
        return 2
    tools = [t for t in every if t.name in names]
    try:
        subset = "quick: the chosen third" if args.quick else ""
        subset = f"--only {args.only}" if args.only else subset
        earlier = _earlier(args.out) if args.resume else ({}, [])
        scores = bench(selected, tools, args.repeat, args.out, subset, earlier)
    except ResumeError as error:
        print(f"hangbench: {error}", file=sys.stderr)
        return 2
    finally:
        receiver.close()
        UPLOAD.close()
    return 0 if scores else 1


class ResumeError(ValueError):
    """A scorecard ``--resume`` cannot go on from: the message names the file and the fix."""


def _earlier(out: Path) -> tuple[dict, list]:
    """What an earlier run into ``out`` scored, if it ran on this checkout's commit."""
    path = out / "scorecard.json"
    if not path.is_file():
        return {}, []
    meta, scores = scorecard.read(path)
    if meta.get("commit") != (here := _commit()):
        raise ResumeError(f"--resume: {path} was run on {meta.get('commit')}, this checkout is "
                          f"{here}; check that commit out, or give another --out")  # fmt: skip
    return meta, scores


def bench(
    cases: list, tools: list, repeat: int, out: Path, subset: str = "",
    earlier: tuple[dict, list] = ({}, []),
) -> list:  # fmt: skip
    """Every case under every tool, ``repeat`` times; with ``earlier`` (``--resume``), only the
    runs it has not scored, its minutes counted in."""
    started = time.time() - 60 * earlier[0].get("minutes", 0.0)
    scores = list(earlier[1])
    done = {(s.case, s.tool, s.repeat) for s in scores}
    meta = {"when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "repeat": repeat,
            "tools": [t.name for t in tools], "machine": f"{os.cpu_count()} cores",
            "commit": _commit(), "subset": subset}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="hangbench-") as tmp:
        for n, case in enumerate(cases, 1):
            for r in range(repeat):
                todo = [t for t in tools if (case.name, t.name, r) not in done]
                scores += run_case(case, todo, r, Path(tmp) / f"{case.name}-{r}", out / "runs")
                mine = [s for s in scores if s.case == case.name and s.repeat == r]
                print(
                    f"[{n}/{len(cases)} {time.time() - started:5.0f} s] {case.name}: "
                    + "; ".join(f"{s.tool} {scorecard._cell([s])}" for s in mine),
                    flush=True,
                )
            meta["minutes"] = (time.time() - started) / 60
            scorecard.write(scores, cases[:n], [t.name for t in tools], out, meta)
    print(f"\nscorecard: {out}/scorecard.md ({(time.time() - started) / 60:.1f} min)")
    print((out / "scorecard.md").read_text().split("\n\n")[1])
    return scores


def run_case(case, tools: list, repeat: int, folder: Path, evidence: Path) -> list:
    """Each tool on a run of its own; a score per tool (``empty`` where it cannot run here,
    ``doubt`` where the run contradicts the label)."""
    scores = []
    for tool in tools:
        if why := available(tool, case) or fixtures.missing(case):
            scores.append(scorecard.Score(case.name, tool.name, repeat, case.label.healthy,
                                          empty=why))  # fmt: skip
            continue
        own = folder / tool.name
        with fixtures.beside(case, own, shared=folder.parent) as storage_dir:
            launch = runs.prepare(case, own, UPLOAD.url(), storage_dir)
            tool.prepare(case, launch)
            window = max(case.limit, tool.reach) + GRACE_S  # its own longer timeout is waited
            run = runs.run(case, launch, own, window)
        if doubt := runs.label_doubt(run):
            print(f"  {case.name} ({tool.name}): {doubt}", flush=True)
            scores.append(scorecard.Score(case.name, tool.name, repeat, case.label.healthy,
                                          doubt=doubt))  # fmt: skip
        else:
            saw = tool.saw(run) if hasattr(tool, "saw") else ""
            scores.append(
                scorecard.score(case, run, tool.name, repeat, tool.signal(run), window, saw)
            )
        _keep(own, evidence / folder.name / tool.name)
    return scores


def _keep(folder: Path, keep: Path) -> None:
    """What a person checks a score against (the launcher's timestamped output, torchfrtrace's
    analysis, the reports) under ``keep``; the rest (a phase's 200 MB file) goes."""
    keep.mkdir(parents=True, exist_ok=True)
    for path in [
        *folder.glob("*.log"),
        *folder.glob("*.txt"),
        *folder.glob("*/*/incidents/*/report.md"),
        *folder.glob("*/*/watchdog/logs/sidecar_*.log"),  # on Slurm (else in output.log)
    ]:
        shutil.copy(path, keep / path.name)
    shutil.rmtree(folder, ignore_errors=True)


def _commit() -> str:
    """The checkout's commit, ``+`` when it has changes of its own."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=runs.REPO, capture_output=True, text=True,
                              check=False, timeout=30)  # fmt: skip
        return done.stdout.strip()

    return (git("rev-parse", "--short", "HEAD") or "?") + (
        "+" if git("status", "--porcelain") else ""
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hangbench",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    parser.add_argument("--only", default="", help="comma-separated parts of case names")
    parser.add_argument("--tool", default="", help="comma-separated tool names (default: all)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each case (default 1)")
    parser.add_argument("--out", type=Path, default=Path("hangbench-results"),
                        help="where the scorecard goes (default hangbench-results/)")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="the chosen third of the cases (quick: true), under areal-watchdog "
                        "unless --tool says otherwise: under 15 minutes")  # fmt: skip
    parser.add_argument("--resume", action="store_true",
                        help="go on from --out's scorecard.json (run on this commit): only the "
                        "runs it has not scored")  # fmt: skip
    parser.add_argument("--list", action="store_true", help="list the cases and their labels")
    return parser


if __name__ == "__main__":
    sys.exit(main())
