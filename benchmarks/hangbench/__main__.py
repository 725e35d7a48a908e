"""HangBench: ``python -m benchmarks.hangbench`` runs every case under every tool and writes the
scorecard (``--only``, ``--tool``, ``--repeat`` for the impatient; ``--quick``: the chosen third
of the cases marked ``quick: true``, under areal-watchdog unless ``--tool`` says otherwise, in
under 15 minutes; docs/hangbench.md).

Each tool watches a run of its own, but PyTorch's rows, which differ only in the collective
timeout and share one run until its shortest timeout fires (``sharing.py``): no tool's action (a
kill, a ``SIGCONT``, a launcher in torchrun's place) reaches another's score. A run lasts until
the case's limit (or the tool's own longer timeout) has passed since its hang, until a healthy
job ends, or until every tool in it has signalled; one that contradicts its label scores for no
tool.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.hangbench import fixtures, runs, scorecard, sharing
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
    # a SIGTERM (kill, a session's end) unwinds as Ctrl-C does: the run in flight is ended
    # whole (its process group, AReaL's own sessions, its Slurm job); what was scored is kept
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
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
    """What an earlier run into ``out`` scored, if nothing it ran has changed since its commit
    (a later commit of docs or tests only is the same benchmark)."""
    path = out / "scorecard.json"
    if not path.is_file():
        return {}, []
    meta, scores = scorecard.read(path)
    if changed := _changed_since(str(meta.get("commit", "?"))):
        raise ResumeError(f"--resume: {path} was run on {meta.get('commit')}, and this checkout "
                          f"changed what it runs ({', '.join(changed[:3])}); check that commit "
                          "out, or give another --out")  # fmt: skip
    if (here := _commit()) != meta.get("commit"):
        meta["resumed_on"] = [*meta.get("resumed_on", []), here]
    return meta, scores


NOT_RUN = ("docs/", "tests/", ".ci/", "README.md")  # what no run reads


def _changed_since(commit: str) -> list[str]:
    """The files a run reads that differ between ``commit`` and this checkout (every file where
    the commit is unknown or had changes of its own, marked ``+``)."""
    if commit.endswith("+") or not _git("rev-parse", "--verify", "-q", f"{commit}^{{commit}}"):
        return [f"{commit} cannot be compared"]
    paths = (
        _git("diff", "--name-only", commit).split()
        + _git("ls-files", "--others", "--exclude-standard").split()
    )
    return [p for p in paths if not p.startswith(NOT_RUN)]


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
    meta.update({k: earlier[0][k] for k in ("when", "commit", "resumed_on") if k in earlier[0]})
    meta["cells"] = len(cases) * len(tools) * repeat
    with tempfile.TemporaryDirectory(prefix="hangbench-") as tmp:
        for r in range(repeat):  # every case once before any twice: a partial run is a full one
            for n, case in enumerate(cases, 1):
                todo = [t for t in tools if (case.name, t.name, r) not in done]
                if not todo:
                    continue
                scores += run_case(case, todo, r, Path(tmp) / f"{case.name}-{r}", out / "runs")
                mine = [s for s in scores if s.case == case.name and s.repeat == r]
                print(
                    f"[repeat {r + 1}/{repeat}, {n}/{len(cases)} {time.time() - started:5.0f} s] "
                    f"{case.name}: " + "; ".join(f"{s.tool} {scorecard._cell([s])}" for s in mine),
                    flush=True,
                )
                meta["minutes"] = (time.time() - started) / 60
                ran = [c for c in cases if any(s.case == c.name for s in scores)]
                scorecard.write(scores, ran, [t.name for t in tools], out, meta)
    print(f"\nscorecard: {out}/scorecard.md ({(time.time() - started) / 60:.1f} min)")
    print((out / "scorecard.md").read_text().split("\n\n")[1])
    return scores


def run_case(case, tools: list, repeat: int, folder: Path, evidence: Path) -> list:
    """Each tool on a run of its own but PyTorch's rows, which share one (``sharing.py``); a
    score per tool (``empty`` where it cannot run here, ``doubt`` where the run contradicts the
    label)."""
    scores, todo = [], []
    for tool in tools:
        if why := available(tool, case) or fixtures.missing(case):
            scores.append(scorecard.Score(case.name, tool.name, repeat, case.label.healthy,
                                          empty=why))  # fmt: skip
        else:
            todo.append(tool)
    for group in sharing.groups(todo):
        scores += _run_group(case, group, repeat, folder, evidence)
    return scores


def _run_group(case, group: list, repeat: int, folder: Path, evidence: Path) -> list:
    """One run read by every tool of ``group``; a tool whose reading another's timeout cut short
    runs again on its own."""
    name = "+".join(t.name for t in group)
    own = folder / name
    windows = {t.name: max(case.limit, t.reach) + GRACE_S for t in group}  # its own is waited
    with fixtures.beside(case, own, shared=folder.parent) as storage_dir:
        launch = runs.prepare(case, own, UPLOAD.url(), storage_dir)
        for tool in group:
            tool.prepare(case, launch)
        run = runs.run(case, launch, own, max(windows.values()),
                       functools.partial(sharing.settled, group))  # fmt: skip
    shared = name if len(group) > 1 else ""
    if doubt := runs.label_doubt(run):
        print(f"  {case.name} ({name}): {doubt}", flush=True)
        _keep(own, evidence / folder.name / name)
        return [scorecard.Score(case.name, t.name, repeat, case.label.healthy, doubt=doubt,
                                shared=shared) for t in group]  # fmt: skip
    acted = sharing.acted_at(run) if shared else None
    hang_at = None if case.label.healthy else run.step_at(case.label.after_step)
    scores, alone = [], []
    for tool in group:
        signal = tool.signal(run)
        closes = hang_at + windows[tool.name] if hang_at else None
        if sharing.cut(tool, group, signal, closes, acted):
            alone.append(tool)
            continue
        saw = tool.saw(run) if hasattr(tool, "saw") else ""
        scores.append(scorecard.score(case, run, tool.name, repeat, signal, windows[tool.name],
                                      saw, shared))  # fmt: skip
    _keep(own, evidence / folder.name / name)
    for tool in alone:
        print(f"  {case.name}: the shared run's timeout fired before {tool.name} had its answer: "
              "a run of its own", flush=True)  # fmt: skip
        scores += _run_group(case, [tool], repeat, folder, evidence)
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
    dirty = "+" if _git("status", "--porcelain") else ""
    return (_git("rev-parse", "--short", "HEAD") or "?") + dirty


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=runs.REPO, capture_output=True, text=True,
                          check=False, timeout=30)  # fmt: skip
    return done.stdout.strip()


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
                        help="go on from --out's scorecard.json (run on this commit, or one "
                        "differing in docs and tests only): only the runs not scored")  # fmt: skip
    parser.add_argument("--list", action="store_true", help="list the cases and their labels")
    return parser


if __name__ == "__main__":
    sys.exit(main())
