"""The tools HangBench scores, each as its users run it: what it adds to a run before it starts
(``prepare``) and the first signal it gave, read from what the run left (``signal``).

A tool names a kind and culprit ranks where it can; a peer that names nothing says so with an
empty kind. Add a tool by writing a class with ``name``, ``needs``, ``prepare`` and ``signal``
and listing it in ``TOOLS`` (docs/hangbench.md).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from benchmarks.bench_diagnose import CULPRIT, fill_pg_config, torchfrtrace
from benchmarks.hangbench.cases import REPO, Case
from benchmarks.hangbench.runs import HOOKS, Launch, Run
from testkit.receiver import Receiver

PEERS = REPO / ".hangbench-peers"  # nvidia-resiliency-ext, installed by scripts/setup.sh --peers
FT_PYTHON = Path(__file__).resolve().parent / "ft_python"
FT_WARMUP = 5  # steps before ft_launcher's timeouts are learned, where a job has no phase
FT_CHECK_S = 5.0  # ft_launcher's workload_check_interval (its default)
TORCH_DEFAULT_S = 1800.0  # gloo's default collective timeout (NCCL's: 600 s)
# torch-tuned's timeout, chosen before the run: 1.5 times the healthy cases' longest phase
# (rank 0's 35 s evaluation alone, demo-eval_alone), rounded up to the minute
TUNED_TIMEOUT_S = 60.0
TORCH_ERROR = re.compile(r"HANGBENCH torch_error rank=(\d+) at=([\d.]+) (.*)")
ROOT_CAUSE = re.compile(r"rank\s*:\s*(\d+) \(local_rank")
FT_FIRED = re.compile(
    r"\[RankMonServer\d+@[^\]]*:(\d+)\] (?:Did not get (?:initial|subsequent) heartbeat"
    r"|Section '[^']+' has been open for|Was out of section for)"
)


@dataclass(frozen=True)
class Signal:
    """A tool's first word that something is wrong."""

    at: float
    kind: str = ""
    culprits: tuple[int, ...] = ()
    detail: str = ""
    servers: tuple[str, ...] = ()  # the inference servers it named (their addresses)


class AreaLWatchdog:
    """areal-watchdog at its shipped defaults (which docs/how-it-works.md recommends), posting to
    a signed webhook: the first report posted is its signal."""

    name = "areal-watchdog"
    needs = ""
    in_ranks = False  # it needs no line in the ranks: it watches AReaL's own workers too
    reach = 0.0  # seconds its own settings may take past the case's limit: none
    share = name  # a run of its own (sharing.py)
    timeout_s = None  # it sets no collective timeout
    early_end = True  # its first post is read as the run goes on

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def prepare(self, case: Case, launch: Launch) -> None:
        """The webhook added to what the case's ``watchdog`` section says of its machine (a
        recorded GPU): the case reaches the run whole."""
        launch.args.append("--watchdog")
        launch.config["watchdog"] = {**launch.config.get("watchdog", {}), "notify": [
            {"type": "webhook", "url_env": "BENCH_HOOK_URL", "secret_env": "BENCH_HOOK_SECRET"}
        ]}  # fmt: skip

    def signal(self, run: Run) -> Signal | None:
        for wall, posted in self._posted(run):
            if posted["job"].get("trial_name") != run.case.trial or wall < run.started:
                continue
            verdict = posted["verdict"]
            report = _report(run, posted["incident_id"])  # its cause is not in the webhook's body
            kinds = "/".join(k for k in (verdict["category"], report.get("cause")) if k)
            ranks = tuple(verdict.get("culprit_ranks") or ())
            summary = verdict.get("summary", "")[:160]
            return Signal(wall, kinds, ranks, summary, _servers(report))
        return None

    def _posted(self, run: Run) -> list[tuple[float, dict]]:
        """What reached the webhook: the benchmark's receiver, and, for a run in a loopback
        namespace, the receiver beside it (``loopback_run.py``)."""
        posted = [(r.wall, r.json()) for r in self.receiver.requests]
        hooks = run.folder / HOOKS
        if hooks.is_file():
            posted += [
                (h["wall"], h["body"]) for h in map(json.loads, hooks.read_text().split("\n")[:-1])
            ]
        return sorted(posted, key=lambda p: p[0])

    def saw(self, run: Run) -> str:
        """What it saw short of posting: the looks it wrote and did not post."""
        looks = len(list((run.run_dir / "suspected").glob("*/report.json")))
        return f"{looks} look(s) written, not posted" if looks else "no look"


def _servers(report: dict) -> tuple[str, ...]:
    """The inference servers a report names among its culprits, by address."""
    workers = report.get("culprit_workers") or []
    return tuple(sorted(w["address"] for w in workers
                        if "server" in w.get("role", "") and w.get("address")))  # fmt: skip


def _report(run: Run, incident_id: str) -> dict:
    path = run.run_dir / "incidents" / incident_id / "report.json"
    return json.loads(path.read_text()) if path.is_file() else {}


class TorchTimeout:
    """No watchdog: PyTorch's collective timeout on every process group, and torchrun's exit.
    The error names no culprit; torchrun's summary names the first rank that failed.

    Two rows: ``torch-default``, the timeout most jobs run with (gloo's 30 min; NCCL's is
    10 min), past any run here, so that only a crash ends a run for it; ``torch-tuned``,
    ``TUNED_TIMEOUT_S``, chosen before the run from the healthy cases' longest phase."""

    needs = ""
    share = "torch"  # one run with the shortest timeout serves every PyTorch row (sharing.py)
    early_end = False

    def __init__(self, name: str, seconds: float, reach: float) -> None:
        self.name, self.timeout_s, self.reach = name, seconds, reach
        # the default is the job as it ships (AReaL's own timeouts); a tuned one needs the ranks
        self.in_ranks = seconds != TORCH_DEFAULT_S

    def prepare(self, case: Case, launch: Launch) -> None:
        shortest(launch, self.timeout_s)

    def signal(self, run: Run) -> Signal | None:
        controller = "\n".join(line for _, line in run.lines)  # AReaL's controller prints them
        errors = torch_errors(run) + torch_errors_in(controller)
        failed = [(at, line) for at, line in run.lines if "ChildFailedError" in line]
        first = min([*errors, *failed], default=None)
        if first is None:
            return None
        text = "\n".join(line for _, line in run.lines)
        root = ROOT_CAUSE.search(text.split("Root Cause", 1)[-1]) if "Root Cause" in text else None
        culprits = (int(root.group(1)),) if root else ()
        return Signal(first[0], "", culprits, first[1][:160])


class FlightRecorderTrace:
    """PyTorch's Flight Recorder analyser, ``torchfrtrace``, on the dumps every rank wrote when
    its collective timed out or torchrun ended it (NCCL's dump on timeout, emulated on gloo by
    the harness). gloo's dumps carry no ``pg_config`` and torchfrtrace dies on them
    (``KeyError``), so it is filled from the entries first, as NCCL writes it
    (``benchmarks/bench_diagnose.py``). It reads the dumps written before the run was ended (on
    Slurm a node whose ranks never raise dumps only when ``scancel`` ends it), and its signal is
    when the last of them was written; it names the ranks of its first finding, and a mismatch
    where that finding is one."""

    name = "torchfrtrace"
    needs = ""
    in_ranks = True  # the dump on timeout, in each rank
    reach = TUNED_TIMEOUT_S
    share = "torch"  # the torch-tuned row's run, read another way (sharing.py)
    timeout_s = TUNED_TIMEOUT_S
    early_end = False

    def prepare(self, case: Case, launch: Launch) -> None:
        """The dump comes with the collective's timeout (NCCL's ``TORCH_NCCL_DUMP_ON_TIMEOUT``):
        the ``torch-tuned`` row's (the harness dumps to HANGBENCH_FR_DIR on every run)."""
        shortest(launch, self.timeout_s)

    def signal(self, run: Run) -> Signal | None:
        folder, in_time = run.folder / "flight_recorder", run.folder / "flight_recorder_in_time"
        ended = run.ended or float("inf")
        dumps = [p for p in sorted(folder.glob("rank_*")) if p.stat().st_mtime <= ended]
        if not dumps:
            return None
        in_time.mkdir(exist_ok=True)
        for dump in dumps:
            shutil.copy2(dump, in_time / dump.name)
        filled = run.folder / "flight_recorder_filled"
        launch = run.case.config.get("launch") or {}
        world = int((run.case.config.get("cluster") or {}).get("n_nodes", 1)) * int(
            launch.get("nproc_per_node", 1)
        )
        fill_pg_config(in_time, filled, "rank_", world)
        incomplete = ["--allow-incomplete-ranks"]  # a rank that never raised wrote no dump
        out = subprocess.run([*torchfrtrace(), str(filled), "-p", "rank_", *incomplete],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        report = out.stdout + out.stderr
        (run.folder / "torchfrtrace.txt").write_text(report)
        kind, culprits = read_frtrace(report)
        return Signal(max(p.stat().st_mtime for p in dumps), kind, culprits, _first_line(report))


def torch_errors(run: Run) -> list[tuple[float, str]]:
    """The collective errors the harness printed in the ranks' logs: (when, the error)."""
    return [e for log in run.rank_logs() for e in torch_errors_in(log.read_text(errors="replace"))]


def torch_errors_in(text: str) -> list[tuple[float, str]]:
    """The collective errors the harness printed in ``text`` (a controller's output too)."""
    return [(float(m.group(2)), m.group(3)) for m in TORCH_ERROR.finditer(text)]


def shortest(launch: Launch, seconds: float) -> None:
    """The run's collective timeout: the shortest any of its tools asks for."""
    now = float(launch.env.get("HANGBENCH_COLLECTIVE_TIMEOUT", "inf"))
    launch.env["HANGBENCH_COLLECTIVE_TIMEOUT"] = f"{min(now, seconds):g}"


def read_frtrace(report: str) -> tuple[str, tuple[int, ...]]:
    """The kind and ranks of ``torchfrtrace``'s first finding: a mismatch of collectives (type,
    size, state) names ``collective_mismatch``; ranks missing from a collective name no kind."""
    for block in re.split(r"\n(?=Collective sequence number|Not all ranks joining)", report):
        ranks = {int(a) for a, _ in CULPRIT.findall(block) if a}
        ranks |= {int(r) for _, b in CULPRIT.findall(block) if b for r in b.split(",")}
        if ranks:
            mismatch = re.search(r"mismatch", block, re.I)
            return ("collective_mismatch" if mismatch else ""), tuple(sorted(ranks))
    return "", ()


def _first_line(report: str) -> str:
    lines = [line.strip() for line in report.splitlines() if line.strip()]
    hits = [line for line in lines if "Culprit" in line or "missing" in line or "Error" in line]
    return (hits or lines or ["(no output)"])[0][:160]


class FaultTolerance:
    """nvidia-resiliency-ext's ``ft_launcher`` (0.4.1) in torchrun's place, configured as its
    documentation's examples are (``FT_CONFIGS``: ``examples/fault_tolerance/
    fault_tol_cfg_heartbeats.yaml`` and ``fault_tol_cfg_sections.yaml``), the calls its
    integration guides ask for added by the harness, and its timeouts learned once the job has
    been through its first full cycle of phases (``first_cycle``). Its action is made a
    harmless SIGCONT: its detection is unchanged, the run goes on to the end."""

    needs = "nvidia-resiliency-ext (bash scripts/setup.sh --peers)"
    installed = PEERS / "nvidia_resiliency_ext"
    in_ranks = True  # its launcher in torchrun's place, its calls in each rank
    timeout_s = None  # it sets no collective timeout
    early_end = True  # its first alarm is read from the output as the run goes on

    def __init__(self, api: str) -> None:
        self.api, self.name = api, f"ft-{api}"
        self.share = self.name  # its launcher in torchrun's place: a run of its own
        timeouts = FT_CONFIGS["sections"]["fault_tolerance"]
        longest = max(timeouts["rank_out_of_section_timeout"],
                      *timeouts["rank_section_timeouts"].values())  # fmt: skip
        self.reach = longest + FT_CHECK_S if api == "sections" else 0.0

    def prepare(self, case: Case, launch: Launch) -> None:
        launch.config["launch"]["python"] = str(FT_PYTHON)
        own = launch.config["launch"]["env"].get("PYTHONPATH")  # the job's own (AReaL's site/)
        path = os.pathsep.join(p for p in (str(PEERS), own, os.environ.get("PYTHONPATH")) if p)
        config = Path(launch.env["HANGBENCH_FR_DIR"]).parent / f"ft_{self.api}.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(yaml.safe_dump(FT_CONFIGS[self.api]))
        launch.env.update({
            "HANGBENCH_PYTHON": sys.executable, "PYTHONPATH": path,
            "HANGBENCH_FT_API": self.api, "HANGBENCH_FT_LEARN_AT": str(first_cycle(case)),
            "HANGBENCH_FT_ARGS": f"--ft-cfg-path {config} --ft-rank-termination-signal SIGCONT "
                                 "--max-restarts 0",
        })  # fmt: skip

    def signal(self, run: Run) -> Signal | None:
        fired = [(at, int(m.group(1)), line) for at, line in run.lines
                 if (m := FT_FIRED.search(line))]  # fmt: skip
        if not fired:
            return None
        first = fired[0][0]
        ranks = tuple(sorted({rank for at, rank, _ in fired if at - first < 1.0}))
        return Signal(first, "", ranks, fired[0][2][:160])


# The two configurations of nvidia-resiliency-ext's examples/fault_tolerance/: no heartbeat
# timeout until one is calculated; the sections' fixed timeouts, 'step' recalculated later
FT_CONFIGS: dict[str, dict] = {
    "heartbeats": {"fault_tolerance": {
        "initial_rank_heartbeat_timeout": None, "rank_heartbeat_timeout": None}},
    "sections": {"fault_tolerance": {
        "initial_rank_heartbeat_timeout": None, "rank_heartbeat_timeout": None,
        "rank_section_timeouts": {"init": 20.0, "step": 10.0, "checkpoint": 30.0},
        "rank_out_of_section_timeout": 30.0}},
}  # fmt: skip


def first_cycle(case: Case) -> int:
    """The step after which ft_launcher's timeouts are learned: the end of the job's first full
    cycle of phases (the step after its last slow phase: an evaluation, a checkpoint, a slow
    step), as its example learns after the first epoch, validation and checkpoint included;
    ``FT_WARMUP`` steps where the job has no phase."""
    demo = case.config.get("demo") or {}
    spec = str(demo.get("phases") or "").split(",")
    phases = [int(p.partition("@")[2]) for p in spec if "@" in p]
    steps = [*phases, int(demo.get("slow_step") or 0), int(demo.get("pause_step") or 0)]
    return max([FT_WARMUP, *(s + 1 for s in steps if s > 0)])


def available(tool: object, case: Case) -> str:
    """Why a tool cannot run here, or on this case ('' when it can)."""
    installed = getattr(tool, "installed", None)  # the package it runs, where it needs one
    if installed is not None and not installed.is_dir():
        return f"not installed: {getattr(tool, 'needs', '')}"
    if getattr(tool, "in_ranks", False) and not case.torchrun_ranks:
        return "not applicable: AReaL's scheduler starts its workers, not torchrun"
    return ""
