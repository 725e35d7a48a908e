"""The trajectory hook's cost on real AReaL steps: the CPU harness's GRPO experiment run twice
(dump on, dump off) under ``areal-launch --watchdog local``, step times side by side."""

from __future__ import annotations

import importlib.util
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "examples" / "areal" / "gsm8k_grpo.yaml"
STEP_DONE = re.compile(r"(\d{8}-\d\d:\d\d:\d\d\.\d+) StatsLogger INFO: .*Train step (\d+)/\d+ done")
WAITED = re.compile(r"the training loop waited ([\d.]+) ms per step")
STEPS = 8

Rows = list[tuple[str, str, str]]
HARNESS = REPO / "examples" / "areal" / "harness" / "make_tiny.py"


def cannot_run() -> str | None:
    """Why a benchmark of real AReaL runs cannot run here (None: it can)."""
    if importlib.util.find_spec("areal") is None or os.geteuid() != 0:
        return "needs the areal package and root"
    return None


def make_harness(folder: Path, *flags: str) -> None:
    """The CPU harness (tiny model, tokenizer, dataset) in ``folder``, made offline."""
    subprocess.run([sys.executable, str(HARNESS), str(folder), *flags], check=True,
                   capture_output=True)  # fmt: skip


def step_seconds(log: Path) -> list[float]:
    """Seconds between consecutive ``Train step k/N done`` lines (the first step excluded)."""
    lines = STEP_DONE.findall(log.read_text(errors="replace"))
    times = [datetime.strptime(t, "%Y%m%d-%H:%M:%S.%f") for t, _ in lines]
    return [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)]


def run_experiment(root: Path, trial: str, dump: bool) -> tuple[list[float], float | None]:
    """(step times, the hook's own median wait in ms) of one healthy run."""
    cmd = [
        "bash", str(REPO / "scripts" / "loopback.sh"), sys.executable, "-m", "areal_watchdog.cli",
        "--watchdog", "local", str(CONFIG), f"cluster.fileroot={root}", f"trial_name={trial}",
        f"total_train_steps={STEPS}", f"++watchdog.trajectory.enabled={str(dump).lower()}",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        output = (done.stdout + done.stderr)[-2000:]
        raise RuntimeError(f"the AReaL run failed ({done.returncode}): {output}")
    log = next((root / "logs").glob(f"*/gsm8k-grpo/{trial}/main.log"))
    hook = "\n".join(p.read_text() for p in (root / "gsm8k-grpo" / trial).glob("watchdog/logs/*"))
    waited = WAITED.search(hook)
    return step_seconds(log), float(waited.group(1)) if waited else None


def run_areal_benchmarks(quick: bool = False) -> Iterator[tuple[str, Rows]]:
    title = (
        f"Trajectory hook on real AReaL 1.0 steps (GRPO, CPU harness, single controller, "
        f"{STEPS} steps per run, runs alternated)"
    )
    if cannot_run():
        yield title, [("skipped", cannot_run(), "-")]
        return
    with tempfile.TemporaryDirectory(prefix="areal-bench-hook-") as tmp:
        root = Path(tmp)
        make_harness(root / "harness")
        off: list[float] = []
        on: list[float] = []
        waits: list[float] = []
        for pair in range(1 if quick else 2):  # alternated, so a slow minute hits both sides
            off += run_experiment(root, f"dumpoff{pair}", dump=False)[0]
            times, waited = run_experiment(root, f"dumpon{pair}", dump=True)
            on += times
            waits += [waited] if waited is not None else []
    off_s, on_s = statistics.median(off), statistics.median(on)
    waited = statistics.median(waits) if waits else None
    rows: Rows = [
        ("median step, dump off", f"{off_s:.3f} s", "-"),
        ("median step, dump on", f"{on_s:.3f} s (x{on_s / off_s:.3f})", "<= x1.05"),
        (
            "loop waited for the dump (measured in the hook)",
            f"{waited:.1f} ms per step ({waited / 1000 / on_s * 100:.2f} % of a step)"
            if waited is not None
            else "not reported",
            "<= 5 % of a step",
        ),
    ]
    yield title, rows
