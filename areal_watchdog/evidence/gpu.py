"""GPU state behind one interface: NVML, ``nvidia-smi``, recorded samples, or none.

``GpuMonitor.sample()`` returns one ``GpuSample`` per device: utilisation, memory, power draw
and the pids running on it. ``gpu_state`` tells idle, spinning and working apart: NCCL kernels
that wait for a peer keep utilisation near 100% at a low power draw, so power decides.
``IdleTracker`` turns samples over time into the "idle GPUs" stall signal.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass
class GpuSample:
    """One device at one moment."""

    index: int
    uuid: str
    utilization: float  # percent
    memory_used_mb: float
    memory_total_mb: float
    power_w: float | None
    power_limit_w: float | None
    pids: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gpu_state(sample: GpuSample, idle_utilization: float, spin_power_fraction: float) -> str:
    """``idle`` (utilisation under the threshold), ``spinning`` (busy at low power: a NCCL
    wait), or ``working``."""
    if sample.utilization < idle_utilization:
        return "idle"
    limit = sample.power_limit_w
    if sample.power_w is not None and limit and sample.power_w < spin_power_fraction * limit:
        return "spinning"
    return "working"


class GpuBackend(Protocol):
    name: str

    def sample(self) -> list[GpuSample]: ...


class NoGpu:
    """No GPU on this node: the watchdog works exactly as without this module."""

    name = "none"

    def sample(self) -> list[GpuSample]:
        return []


class NvmlBackend:
    """NVIDIA's NVML through ``nvidia-ml-py`` (module ``pynvml``)."""

    name = "nvml"

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handles = [
            pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
        ]

    def sample(self) -> list[GpuSample]:
        nvml, samples = self.nvml, []
        for index, handle in enumerate(self.handles):
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                power = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
                limit = nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
            except nvml.NVMLError:
                power = limit = None
            try:
                pids = [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
            except nvml.NVMLError:
                pids = []
            uuid = nvml.nvmlDeviceGetUUID(handle)
            samples.append(
                GpuSample(
                    index,
                    uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                    memory.used / 2**20,
                    memory.total / 2**20,
                    power,
                    limit,
                    pids,
                )
            )
        return samples


class NvidiaSmiBackend:
    """``nvidia-smi --query-gpu`` and ``--query-compute-apps`` in CSV, when NVML is missing."""

    name = "nvidia-smi"
    QUERY = "index,uuid,utilization.gpu,memory.used,memory.total,power.draw,power.limit"

    def __init__(self, executable: str = "nvidia-smi", timeout: float = 5.0) -> None:
        self.executable, self.timeout = executable, timeout

    def _csv(self, *args: str) -> list[list[str]]:
        out = subprocess.run(
            [self.executable, *args, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=self.timeout,
            check=True,
        )
        return [[c.strip() for c in row] for row in csv.reader(io.StringIO(out.stdout)) if row]

    def sample(self) -> list[GpuSample]:
        pids: dict[str, list[int]] = {}
        for row in self._csv("--query-compute-apps=pid,gpu_uuid"):
            if len(row) >= 2 and row[0].isdigit():
                pids.setdefault(row[1], []).append(int(row[0]))
        samples = []
        for row in self._csv(f"--query-gpu={self.QUERY}"):
            index, uuid, util, used, total, power, limit = (row + [""] * 7)[:7]
            samples.append(
                GpuSample(
                    int(index),
                    uuid,
                    _number(util) or 0.0,
                    _number(used) or 0.0,
                    _number(total) or 0.0,
                    _number(power),
                    _number(limit),
                    pids.get(uuid, []),
                )
            )
        return samples


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


class RecordedBackend:
    """Replays NVML readings from a JSON-lines file over time (for machines without a GPU).

    Each line: ``{"t": seconds since the start, "gpus": [GpuSample fields...]}``; ``sample()``
    returns the newest line whose ``t`` has passed.
    """

    name = "recorded"

    def __init__(self, path: str | Path, clock: Any = time.monotonic) -> None:
        self.frames = [
            json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()
        ]
        self.clock, self.start = clock, clock()

    def sample(self) -> list[GpuSample]:
        elapsed = self.clock() - self.start
        current = [f for f in self.frames if f["t"] <= elapsed]
        frame = current[-1] if current else self.frames[0]
        return [GpuSample(**g) for g in frame["gpus"]]


def open_backend(kind: str, recording: str | None = None) -> GpuBackend:
    """The configured backend; ``auto`` tries NVML, then nvidia-smi, then none."""
    if kind == "none":
        return NoGpu()
    if kind == "recorded":
        if not recording:
            raise ValueError("watchdog.gpu.recording must name a file of samples")
        return RecordedBackend(recording)
    if kind in ("auto", "nvml"):
        try:
            return NvmlBackend()
        except Exception:  # noqa: BLE001 - no driver, no library, no device
            if kind == "nvml":
                raise
    if kind in ("auto", "nvidia-smi") and shutil.which("nvidia-smi"):
        backend = NvidiaSmiBackend()
        try:
            backend.sample()
            return backend
        except (OSError, subprocess.SubprocessError):
            if kind == "nvidia-smi":
                raise
    if kind == "nvidia-smi":
        raise FileNotFoundError("nvidia-smi is not on PATH")
    return NoGpu()


@dataclass
class IdleTracker:
    """Since when every GPU of the job on this node has been idle or spinning, and when each
    one last worked (a second look asks whether a rank's GPU worked since the first)."""

    idle_utilization: float = 10.0
    spin_power_fraction: float = 0.3
    quiet_since: float | None = None
    last: list[GpuSample] = field(default_factory=list)
    worked_at: dict[int, float] = field(default_factory=dict)  # GPU index -> last working sample

    def update(self, samples: list[GpuSample], job_pids: set[int], now: float) -> None:
        mine = [s for s in samples if not job_pids or set(s.pids) & job_pids] or samples
        self.last = mine
        states = [self.state(s) for s in mine]
        for sample, state in zip(mine, states, strict=True):
            if state == "working":
                self.worked_at[sample.index] = now
        if states and all(s != "working" for s in states):
            self.quiet_since = self.quiet_since or now
        else:
            self.quiet_since = None

    def state(self, sample: GpuSample) -> str:
        return gpu_state(sample, self.idle_utilization, self.spin_power_fraction)

    def quiet_for(self, now: float) -> float:
        return 0.0 if self.quiet_since is None else now - self.quiet_since

    def per_index(self) -> dict[int, dict[str, Any]]:
        """Each GPU by index (when processes cannot be matched: the local rank's GPU)."""
        return {s.index: self._entry(s) for s in self.last}

    def _entry(self, sample: GpuSample) -> dict[str, Any]:
        entry = {**sample.to_dict(), "state": self.state(sample)}
        entry["worked_at"] = self.worked_at.get(sample.index)
        entry.pop("pids")
        return entry

    def per_pid(self) -> dict[int, dict[str, Any]]:
        """Each process's GPU(s) at the last sample, with the state, for the report."""
        return {pid: self._entry(s) for s in self.last for pid in s.pids}
