"""One run of one case: the launch config written, ``areal-launch`` started with what each
selected tool adds (``local``, or ``slurm --wait`` for a case that needs Slurm), every output
line timestamped as it arrives (on Slurm the nodes' logs too, read as they grow), and
everything ended at the end, whatever happened: by its process group, and on Slurm by
``scancel`` (SIGTERM, as torchrun's end is, then Slurm's SIGKILL)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import psutil
import yaml

from benchmarks.hangbench.cases import REPO, Case

HARNESS = Path(__file__).resolve().parent / "harness.py"
STEP_LINE = re.compile(r"Train step (\d+)/")
STARTED = re.compile(r"HANGBENCH started rank=\S+ at=([\d.]+)")
SERVING = re.compile(r"\[sglang-standin\] serving .* on (\S+:\d+)")
STEP_STAMP = re.compile(r"\(AReaL\) (\d{8}-\d\d:\d\d:\d\d\.\d{3}) ")
HEALTHY_LIMIT = 300.0  # a healthy case that has not ended by then is ended (AReaL: ~2 min)
HOOKS = "hooks.jsonl"  # what the receiver beside a run in a loopback namespace got
LOOPBACK = REPO / "scripts" / "loopback.sh"
SLURM_CONF = Path(os.environ.get("AREAL_SLURM_DIR", "/tmp/areal-slurm")) / "slurm.conf"


@dataclass
class Launch:
    """What the tools add to a run before it starts."""

    config: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)


@dataclass
class Run:
    """What a run left for the tools to read their signals from."""

    case: Case
    folder: Path
    run_dir: Path
    started: float
    lines: list[tuple[float, str]]
    returncode: int | None
    extra: dict[str, Any] = field(default_factory=dict)
    ended: float | None = None  # when the runner ended it (what came later came too late)

    def step_at(self, step: int) -> float | None:
        """When the step's line was printed: its own timestamp, else when it arrived; step 0 is
        when the first rank started (the launch, where no rank said so)."""
        if step == 0:
            starts = [float(m.group(1)) for log in self.rank_logs()
                      for m in STARTED.finditer(log.read_text(errors="replace"))]  # fmt: skip
            return min(starts, default=self.started)
        for arrived, line in self.lines:
            match = STEP_LINE.search(line)
            if match and int(match.group(1)) == step:
                stamp = STEP_STAMP.search(line)
                if stamp:
                    return datetime.strptime(stamp.group(1), "%Y%m%d-%H:%M:%S.%f").timestamp()
                return arrived
        return None

    def longest_silence(self) -> float | None:
        """The longest time without a step line, from the first rank's start: a healthy case's
        phase ran when it is about the phase's length (None: no step)."""
        times = [self.step_at(int(m.group(1))) for _, line in self.lines
                 if (m := STEP_LINE.search(line))]  # fmt: skip
        if not any(times):
            return None
        known = sorted(t for t in [self.step_at(0), *times] if t is not None)
        return max((b - a for a, b in pairwise(known)), default=None)

    def servers(self) -> set[str]:
        """The addresses the job's inference servers served on, as each said when it started
        (in the launcher's output, or a rank's where a rank started it)."""
        texts = ["\n".join(line for _, line in self.lines)]
        texts += [log.read_text(errors="replace") for log in self.rank_logs("stdout.log")]
        return {m.group(1) for text in texts for m in SERVING.finditer(text)}

    def rank_logs(self, name: str = "stderr.log") -> list[Path]:
        return sorted(self.run_dir.glob(f"**/attempt_*/*/{name}"))


def label_doubt(run: Run) -> str:
    """Where the run contradicts its label's step: a hang whose last good step never printed,
    or a step printed after it but the one its label says a race may print ('' when it
    agrees)."""
    label = run.case.label
    if label.healthy or label.after_step == 0:
        return ""
    printed = {int(m.group(1)) for _, line in run.lines if (m := STEP_LINE.search(line))}
    if label.after_step not in printed:
        last = max(printed, default=0)
        return f"label doubt: step {label.after_step} was never printed (last: {last})"
    if later := sorted(s for s in printed if s > label.after_step and s != label.racing_step):
        return f"label doubt: step {later[-1]} was printed after the hang's step {label.after_step}"
    return ""


def prepare(case: Case, folder: Path, upload_url: str, storage_dir: str = "") -> Launch:
    """The case's config, its entrypoint the harness (which runs the case's program), with
    ``{case}`` (its folder), ``{upload_url}`` (the benchmark's slow endpoint) and
    ``{storage_dir}`` (the run's FUSE mount) filled in."""
    names = {"{case}": str(case.folder), "{upload_url}": upload_url, "{storage_dir}": storage_dir}
    config = _fill(case.config, names)
    launch = dict(config.get("launch") or {})
    launch["entrypoint"] = str(HARNESS)
    launch["env"] = {**(launch.get("env") or {}), "HANGBENCH_PROGRAM": str(case.program)}
    config["launch"] = launch
    config.setdefault("watchdog", {})
    env = {"HANGBENCH_FR_DIR": str(folder / "flight_recorder"),
           "HANGBENCH_FAILED_DIR": str(folder / "failed")}  # fmt: skip
    return Launch(config=config, env=env)


def _fill(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _fill(v, names) for k, v in value.items()}
    if isinstance(value, str):
        for name, text in names.items():
            value = value.replace(name, text)
    return value


def run(
    case: Case, launch: Launch, folder: Path, hang_at_limit: float,
    settled: Callable[[Run], bool] | None = None,
) -> Run:  # fmt: skip
    """Run to its end, or until ``hang_at_limit`` seconds past the hang's start (or the healthy
    limit) have passed, or until ``settled`` says its tools have what they need; then end every
    process it started."""
    folder.mkdir(parents=True, exist_ok=True)
    config_path = folder / "config.yaml"
    launch.config["launch"]["env"].update(launch.env)
    config_path.write_text(yaml.safe_dump(launch.config))
    on_slurm = "slurm" in case.needs
    backend = ["slurm", "--wait"] if on_slurm else ["local"]
    cmd = [sys.executable, "-m", "areal_watchdog.cli", *launch.args, *backend, str(config_path),
           f"cluster.fileroot={folder}", f"trial_name={case.trial}"]  # fmt: skip
    if "areal" in case.needs:  # AReaL binds 0.0.0.0: a loopback-only namespace, its receiver
        cmd = ["bash", str(LOOPBACK), sys.executable, "-m", "benchmarks.hangbench.loopback_run",
               str(folder / HOOKS), "--", *cmd]  # fmt: skip
    env = {**os.environ, **launch.env}
    if on_slurm:
        env.setdefault("SLURM_CONF", str(SLURM_CONF))
    started = time.time()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        start_new_session=True, env=env,
    )  # fmt: skip
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=_read, args=(proc, lines), daemon=True)
    reader.start()
    experiment = launch.config.get("experiment_name", "hangbench")
    result = Run(case, folder, folder / experiment / case.trial, started, lines, None)
    node_logs = NodeLogs(result.run_dir / "watchdog" / "logs" / "submitit") if on_slurm else None
    try:
        _wait(proc, result, hang_at_limit, node_logs, settled)
    finally:
        result.ended = time.time()
        _end(proc)
        _end_leftovers(folder)
        if on_slurm:
            _cancel_job(result.run_dir, env)
            node_logs.read_into(lines)
        reader.join(timeout=10)
    result.returncode = proc.returncode
    (folder / "output.log").write_text("".join(f"{at:.3f} {line}\n" for at, line in lines))
    return result


def _wait(
    proc: subprocess.Popen, result: Run, limit: float, node_logs: NodeLogs | None,
    settled: Callable[[Run], bool] | None,
) -> None:  # fmt: skip
    label = result.case.label
    checked = time.time()
    while proc.poll() is None:
        if node_logs is not None:
            node_logs.read_into(result.lines)
        if label.healthy:
            deadline = result.started + HEALTHY_LIMIT
        else:
            hang_at = result.step_at(label.after_step)
            deadline = hang_at + limit if hang_at else result.started + HEALTHY_LIMIT
        if time.time() > deadline:
            return
        if settled is not None and time.time() - checked > 1.0:
            checked = time.time()
            if settled(result):
                return
        time.sleep(0.2)


class NodeLogs:
    """A Slurm job's node logs (submitit's ``<job>_<node>_log.out``: the ranks' output,
    torchrun's and ft_launcher's), read on from where the last read ended."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.read: dict[Path, int] = {}
        self.partial: dict[Path, str] = {}

    def read_into(self, lines: list[tuple[float, str]]) -> None:
        """Append the complete lines written since the last read, stamped now."""
        now = time.time()
        for path in sorted(self.folder.glob("*_log.out")):
            with path.open("rb") as fh:
                fh.seek(self.read.get(path, 0))
                data = fh.read()
            self.read[path] = self.read.get(path, 0) + len(data)
            text = self.partial.pop(path, "") + data.decode(errors="replace")
            *complete, rest = text.split("\n")
            self.partial[path] = rest
            lines.extend((now, line) for line in complete)


def _cancel_job(run_dir: Path, env: dict[str, str]) -> None:
    """``scancel`` the run's Slurm job (if it was submitted) and wait until it has left."""
    record = run_dir / "watchdog" / "slurm_job.json"
    if not record.is_file():
        return
    job_id = json.loads(record.read_text())["job_id"]
    subprocess.run(["scancel", job_id], env=env, capture_output=True, check=False, timeout=30)
    deadline = time.time() + 60
    while time.time() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", job_id], env=env, capture_output=True,
                             text=True, check=False, timeout=30)  # fmt: skip
        if not out.stdout.strip():
            return
        time.sleep(0.5)


def _read(proc: subprocess.Popen, lines: list[tuple[float, str]]) -> None:
    for line in proc.stdout or ():
        lines.append((time.time(), line.rstrip("\n")))


def _end_leftovers(folder: Path) -> None:
    """SIGKILL what the run started outside its process group and left behind (AReaL starts
    its workers, and in SPMD mode its launcher, in sessions of their own): every process whose
    watchdog directory or Flight Recorder folder (set for every run) lies below the run's."""
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.uids().real != os.getuid():  # only ours: never another user's
                continue
            env = process.environ()
            mine = (env.get(k, "") for k in ("AREAL_WATCHDOG_DIR", "HANGBENCH_FR_DIR"))
            if any(v.startswith(str(folder)) for v in mine):
                process.kill()


def _end(proc: subprocess.Popen) -> None:
    """SIGTERM to the run's process group (the ranks dump their Flight Recorder), SIGKILL after
    10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            if sig == signal.SIGTERM:
                time.sleep(0.5)  # its children's own teardown
                os.killpg(proc.pid, signal.SIGKILL)
            break
        except (subprocess.TimeoutExpired, ProcessLookupError):
            continue
