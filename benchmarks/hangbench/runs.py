"""One run of one case: the launch config written, ``areal-launch`` started with what each
selected tool adds, every output line timestamped as it arrives, and everything ended by its
process group at the end, whatever happened."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from cases import REPO, Case

HARNESS = Path(__file__).resolve().parent / "harness.py"
STEP_LINE = re.compile(r"Train step (\d+)/")
STARTED = re.compile(r"HANGBENCH started rank=\S+ at=([\d.]+)")
STEP_STAMP = re.compile(r"\(AReaL\) (\d{8}-\d\d:\d\d:\d\d\.\d{3}) ")
HEALTHY_LIMIT = 150.0  # a healthy case that has not ended by then is ended


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

    def rank_logs(self) -> list[Path]:
        return sorted(self.run_dir.glob("**/attempt_*/*/stderr.log"))


def label_doubt(run: Run) -> str:
    """Where the run contradicts its label's step: a hang whose last good step never printed,
    or a step printed after it ('' when it agrees)."""
    label = run.case.label
    if label.healthy or label.after_step == 0:
        return ""
    printed = {int(m.group(1)) for _, line in run.lines if (m := STEP_LINE.search(line))}
    if label.after_step not in printed:
        last = max(printed, default=0)
        return f"label doubt: step {label.after_step} was never printed (last: {last})"
    if later := sorted(s for s in printed if s > label.after_step):
        return f"label doubt: step {later[-1]} was printed after the hang's step {label.after_step}"
    return ""


def prepare(case: Case, folder: Path, upload_url: str) -> Launch:
    """The case's config, its entrypoint the harness (which runs the case's program), with
    ``{case}`` (its folder) and ``{upload_url}`` (the benchmark's slow endpoint) filled in."""
    config = _fill(case.config, {"{case}": str(case.folder), "{upload_url}": upload_url})
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


def run(case: Case, launch: Launch, folder: Path, hang_at_limit: float) -> Run:
    """Run to its end, or until ``hang_at_limit`` seconds past the hang's start (or the healthy
    limit) have passed; then end every process it started."""
    folder.mkdir(parents=True, exist_ok=True)
    config_path = folder / "config.yaml"
    launch.config["launch"]["env"].update(launch.env)
    config_path.write_text(yaml.safe_dump(launch.config))
    cmd = [sys.executable, "-m", "areal_watchdog.cli", *launch.args, "local", str(config_path),
           f"cluster.fileroot={folder}", f"trial_name={case.trial}"]  # fmt: skip
    started = time.time()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        start_new_session=True, env={**os.environ, **launch.env},
    )  # fmt: skip
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=_read, args=(proc, lines), daemon=True)
    reader.start()
    experiment = launch.config.get("experiment_name", "hangbench")
    result = Run(case, folder, folder / experiment / case.trial, started, lines, None)
    try:
        _wait(proc, result, hang_at_limit)
    finally:
        _end(proc)
        reader.join(timeout=10)
    result.returncode = proc.returncode
    (folder / "output.log").write_text("".join(f"{at:.3f} {line}\n" for at, line in lines))
    return result


def _wait(proc: subprocess.Popen, result: Run, limit: float) -> None:
    label = result.case.label
    while proc.poll() is None:
        if label.healthy:
            deadline = result.started + HEALTHY_LIMIT
        else:
            hang_at = result.step_at(label.after_step)
            deadline = hang_at + limit if hang_at else result.started + HEALTHY_LIMIT
        if time.time() > deadline:
            return
        time.sleep(0.2)


def _read(proc: subprocess.Popen, lines: list[tuple[float, str]]) -> None:
    for line in proc.stdout or ():
        lines.append((time.time(), line.rstrip("\n")))


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
