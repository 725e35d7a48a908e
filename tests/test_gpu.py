"""GPU evidence without a GPU: recorded NVML samples and a realistic nvidia-smi on PATH."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_watchdog.evidence.gpu import (
    GpuSample,
    IdleTracker,
    NoGpu,
    NvidiaSmiBackend,
    RecordedBackend,
    gpu_state,
    open_backend,
)

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
