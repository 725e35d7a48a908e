"""GPU evidence without a GPU: recorded NVML samples and a realistic nvidia-smi on PATH."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_watchdog.diagnose.one_process.frames import is_distributed, is_library
from areal_watchdog.evidence.gpu import (
    GpuSample,
    IdleTracker,
    NoGpu,
    NvidiaSmiBackend,
    RecordedBackend,
    gpu_state,
    open_backend,
)
from areal_watchdog.evidence.model import Frame

DATA = Path(__file__).parent / "data" / "gpu"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replay(name: str, until: float) -> IdleTracker:
    """Feed a recording into the tracker once a second up to ``until`` seconds."""
    clock = FakeClock()
    backend = RecordedBackend(DATA / f"{name}.jsonl", clock=clock)
    tracker = IdleTracker(idle_utilization=10, spin_power_fraction=0.3)
    while clock.now <= until:
        tracker.update(backend.sample(), set(), now=clock.now)
        clock.now += 1
    return tracker


@pytest.mark.parametrize(
    ("recording", "quiet_for", "state"),
    [("idle", 6.0, "idle"), ("nccl_spin", 6.0, "spinning"), ("busy", 0.0, "working")],
)
def test_recorded_samples_give_the_expected_decision(
    recording: str, quiet_for: float, state: str
) -> None:
    tracker = replay(recording, until=8)
    assert tracker.quiet_for(now=8) == quiet_for
    assert {g["state"] for g in tracker.per_index().values()} == {state}


def test_spinning_is_told_from_working_by_power() -> None:
    def sample(util: float, power: float | None) -> GpuSample:
        return GpuSample(0, "u", util, 1.0, 2.0, power, 700.0)

    assert gpu_state(sample(100, 90), 10, 0.3) == "spinning"  # NCCL wait: busy at low power
    assert gpu_state(sample(100, 650), 10, 0.3) == "working"
    assert gpu_state(sample(3, 90), 10, 0.3) == "idle"
    assert gpu_state(sample(100, None), 10, 0.3) == "working"  # no power reading: trust util


def test_nvidia_smi_backend_reads_real_output() -> None:
    gpus = NvidiaSmiBackend(executable=str(DATA / "nvidia-smi")).sample()
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].utilization == 100 and gpus[0].power_w == 88.52
    assert gpus[0].memory_used_mb == 61234 and gpus[0].pids == [41234]
    assert gpus[1].power_w is None and gpus[1].pids == [41235]  # "[N/A]"
    tracker = IdleTracker()
    tracker.update(gpus, {41234, 41235}, now=0)
    assert tracker.per_pid()[41234]["state"] == "spinning"
    assert tracker.per_pid()[41235]["state"] == "idle"


def test_auto_without_gpus_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert isinstance(open_backend("auto"), NoGpu)
    with pytest.raises(FileNotFoundError):
        open_backend("nvidia-smi")


def test_auto_uses_nvidia_smi_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{DATA}:/usr/bin:/bin")
    assert open_backend("auto").name == "nvidia-smi"


H200 = DATA / "h200"  # scripts/gpu-check.sh on an NVIDIA H200, 2026-11-27 (its log.txt)


def h200_phase(first: float, last: float) -> list[tuple[float, list[GpuSample]]]:
    lines = (H200 / "nvml_samples.jsonl").read_text().splitlines()
    frames = [json.loads(line) for line in lines]
    return [
        (f["t"], [GpuSample(**g) for g in f["gpus"]]) for f in frames if first <= f["t"] <= last
    ]


def test_a_real_h200_is_idle_with_a_context_in_host_code_and_working_under_matmuls() -> None:
    """NVML through the watchdog's backend on real CUDA processes: a context held while the
    process sleeps in host code (0 % busy at 124 W of 700 W) reads idle for the whole phase;
    4096 x 4096 matrix products (98-99 % at 544 W) read working from the first busy sample."""
    tracker = IdleTracker()
    idle = h200_phase(3.0, 12.0)
    for now, gpus in idle:
        tracker.update(gpus, set(), now=now)
    assert tracker.per_index()[0]["state"] == "idle"
    assert tracker.quiet_for(now=idle[-1][0]) >= 7.0
    for now, gpus in h200_phase(15.0, 23.0):
        tracker.update(gpus, set(), now=now)
        assert tracker.per_index()[0]["state"] == "working"
    assert tracker.quiet_for(now=23.0) == 0.0


def test_py_spy_reads_a_real_cuda_process_down_to_the_cuda_call() -> None:
    """py-spy's dump of the process spinning kernels ends in ``torch.cuda.synchronize``: a
    library frame, and no distributed operation (a rank waiting on its own kernels is not in a
    collective)."""
    (thread,) = json.loads((H200 / "pyspy_busy.json").read_text())
    frames = [Frame(**f) for f in thread["frames"]]
    assert frames[0].name == "synchronize" and frames[0].filename.endswith("torch/cuda/__init__.py")
    assert is_library(frames[0]) and not is_distributed(frames[0])
