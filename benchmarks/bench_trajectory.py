"""Trajectory benchmarks: how long the training loop is blocked per step, and replay loading."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from areal_watchdog.trajectory import TrajectoryRecorder, load_global_batch
from areal_watchdog.trajectory.format import check_file

Rows = list[tuple[str, str, str]]


def make_batch(megabytes: int) -> list[dict[str, torch.Tensor]]:
    """An AReaL-shaped batch of about ``megabytes`` MB, in 8 prompt groups."""
    groups = 8
    per_group = megabytes * 2**20 // groups
    seqlen = 1024
    rows = max(1, per_group // (seqlen * 4 * 3 + seqlen))  # int32 ids, mask, float logprobs, bool
    return [
        {
            "input_ids": torch.randint(0, 32_000, (rows, seqlen), dtype=torch.int32),
            "loss_mask": torch.ones(rows, seqlen, dtype=torch.int32),
            "logprobs": torch.randn(rows, seqlen),
            "versions": torch.zeros(rows, seqlen, dtype=torch.int32),
            "attention_mask": torch.ones(rows, seqlen, dtype=torch.bool),
            "rewards": torch.rand(rows),
        }
        for _ in range(groups)
    ]


def blocked_per_step(directory: Path, batch: list, steps: int) -> tuple[float, float]:
    """(median seconds the loop is blocked by record(), median synchronous torch.save)."""
    sync = []
    for step in range(steps):
        start = time.perf_counter()
        torch.save(batch, directory / f"sync_{step}.pt")
        sync.append(time.perf_counter() - start)
        (directory / f"sync_{step}.pt").unlink()
    recorder = TrajectoryRecorder(directory / "dump", max_keep=2)
    blocked = []
    for step in range(steps):
        start = time.perf_counter()
        recorder.record(step, batch)
        blocked.append(time.perf_counter() - start)
        time.sleep(max(sync) * 1.5)  # the training step; the writer runs meanwhile
    recorder.close()
    return statistics.median(blocked), statistics.median(sync)


def load_times(directory: Path, batch: list, repeat: int) -> tuple[float, float, float]:
    """(best replay load of one step, best plain torch.load, the CLI's checksum pass)."""
    recorder = TrajectoryRecorder(directory / "load", max_keep=None)
    recorder.record(1, batch)
    recorder.close()
    (path,) = (directory / "load").glob("step_000001.pt")
    ours, plain = [], []
    for i in range(repeat):  # alternate which goes first: the page cache favours the second
        for which in ("ours", "plain") if i % 2 else ("plain", "ours"):
            start = time.perf_counter()
            if which == "ours":
                load_global_batch(directory / "load", 1, checksum=False)  # the CLI checked them
            else:
                torch.load(path, weights_only=True)
            (ours if which == "ours" else plain).append(time.perf_counter() - start)
    start = time.perf_counter()
    assert check_file(path) is None
    return min(ours), min(plain), time.perf_counter() - start


def run_trajectory_benchmarks(quick: bool = False) -> Iterator[tuple[str, Rows]]:
    sizes = (1, 64, 512)
    rows: Rows = []
    load_rows: Rows = []
    with tempfile.TemporaryDirectory(prefix="areal-bench-traj-") as tmp:
        directory = Path(tmp)
        for megabytes in sizes:
            batch = make_batch(megabytes)
            steps = 3 if quick or megabytes >= 512 else 5
            blocked, sync = blocked_per_step(directory, batch, steps)
            rows.append(
                (
                    f"{megabytes} MB batch: loop blocked by record()",
                    f"{blocked * 1000:.2f} ms vs torch.save {sync * 1000:.1f} ms "
                    f"({blocked / sync * 100:.2f} %)",
                    "<= 5 % of torch.save",
                )
            )
            ours, plain, verify = load_times(directory, batch, 4 if megabytes >= 512 else 8)
            load_rows.append(
                (
                    f"{megabytes} MB step: replay load",
                    f"{ours * 1000:.1f} ms vs torch.load {plain * 1000:.1f} ms "
                    f"(x{ours / plain:.3f})",
                    "<= x1.10",
                )
            )
            load_rows.append(
                (
                    f"{megabytes} MB step: SHA-256 check (once, before launch)",
                    f"{verify * 1000:.1f} ms",
                    "-",
                )
            )
            del batch
    yield "Trajectory recording (median per step, side by side)", rows
    yield "Replay loading (best of runs; checksums verified once by the CLI)", load_rows
