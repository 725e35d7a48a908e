"""One node's rank processes as the sidecar sees them: which live, which died, how busy they are,
and their evidence when asked."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from areal_watchdog.evidence.discovery import RankProcess, discover
from areal_watchdog.evidence.flight_recorder import collect
from areal_watchdog.evidence.gather import GatherSettings, gather_node
from areal_watchdog.evidence.gpu import GpuBackend, IdleTracker, NoGpu
from areal_watchdog.evidence.model import RankEvidence
from areal_watchdog.evidence.rollout import gather_rollout
from areal_watchdog.rundir.layout import RunLayout

DISCOVERY_EVERY = 10  # polls between full environment scans once all local ranks are known
MIN_CPU_WINDOW = 0.2  # seconds of CPU accounting behind a utilisation figure


@dataclass
class _RankWatch:
    proc: RankProcess
    handle: psutil.Process
    last_cpu: float
    last_sample: float
    utilization: float | None = None


@dataclass
class NodeWatch:
    """The ranks of run ``run_id`` on ``node``."""

    layout: RunLayout
    run_id: str
    node: str
    expected: int  # ranks this node should have
    log: Callable[[str], None] = lambda _m: None
    gpu_backend: GpuBackend = field(default_factory=NoGpu)
    gpus: IdleTracker = field(default_factory=IdleTracker)
    live: dict[int, _RankWatch] = field(default_factory=dict)
    gone: dict[int, RankProcess] = field(default_factory=dict)
    polls: int = 0
    world_size: int | None = None  # ranks beyond it are forged records, never watched

    def refresh(self, now: float, force: bool = False) -> None:
        """Find new rank processes (a full scan only now and then) and sample the known ones."""
        self.polls += 1
        if force or len(self.live) < self.expected or self.polls % DISCOVERY_EVERY == 1:
            for rank, proc in discover(
                self.layout, self.run_id, self.node, self.world_size
            ).items():
                if rank in self.gone and self.gone[rank].pid == proc.pid:
                    continue  # a zombie not yet reaped by torchrun
                if rank in self.live and self.live[rank].proc.pid == proc.pid:
                    self.live[rank].proc = proc  # the registration may have arrived since
                    continue
                try:
                    handle = psutil.Process(proc.pid)
                    cpu = sum(handle.cpu_times()[:2])
                except psutil.Error:
                    continue
                self.live[rank] = _RankWatch(proc, handle, cpu, now)
        for rank, watch in list(self.live.items()):
            try:
                if not watch.handle.is_running() or watch.handle.status() == psutil.STATUS_ZOMBIE:
                    raise psutil.NoSuchProcess(watch.proc.pid)
                cpu = sum(watch.handle.cpu_times()[:2])
            except psutil.Error:
                self.gone[rank] = watch.proc
                del self.live[rank]
                self.log(f"rank {rank} (pid {watch.proc.pid}) exited; {len(self.live)} alive here")
                continue
            elapsed = now - watch.last_sample
            if elapsed >= MIN_CPU_WINDOW:  # shorter windows give noisy utilisation
                watch.utilization = (cpu - watch.last_cpu) / elapsed
                watch.last_cpu, watch.last_sample = cpu, now

    def all_gone(self) -> None:
        """The node's job ended: whatever is still listed is gone too."""
        for rank, watch in list(self.live.items()):
            self.gone[rank] = watch.proc
        self.live.clear()

    def evidence(self, settings: GatherSettings) -> list[RankEvidence]:
        """A stack from every live rank, exit details for the others, GPU state when known."""
        self.refresh(time.time(), force=True)
        live = {r: w.proc for r, w in self.live.items()}
        cpu = {w.proc.pid: w.utilization for w in self.live.values() if w.utilization is not None}
        items = gather_node(self.layout, self.node, live, dict(self.gone), cpu, settings)
        by_pid = self.gpus.per_pid()
        by_index = {g["index"]: g for g in by_pid.values()} or self.gpus.per_index()
        for item in items:
            item.gpu = by_pid.get(item.pid) or by_index.get(item.local_rank)
        return items

    def sample_gpus(self, now: float) -> None:
        """Sample the node's GPUs (NVML, nvidia-smi, a recording, or nothing)."""
        try:
            samples = self.gpu_backend.sample()
        except Exception as exc:  # noqa: BLE001 - a flaky driver must not stop the watchdog
            self.log(f"GPU sampling failed: {exc}")
            return
        self.gpus.update(samples, {w.proc.pid for w in self.live.values()}, now)

    def pids(self) -> list[int]:
        """The live ranks' process ids."""
        return [w.proc.pid for w in self.live.values()]

    def rollout(self, items: list[RankEvidence], timeout: float) -> list[dict[str, Any]]:
        """Attach each live rank's pending asyncio tasks; return the inference-server probes."""
        dumps, servers = gather_rollout(self.layout, self.pids(), timeout)
        for item in items:
            if item.pid in dumps:
                item.tasks = dumps[item.pid].get("tasks", [])
        return servers

    def flight_records(self, timeout: float) -> dict[str, dict[str, Any]]:
        """Each live rank's Flight Recorder trace (keyed by rank as a string, as in JSON)."""
        traces = collect(self.layout, sorted(self.live), timeout)
        return {str(rank): trace for rank, trace in traces.items()}

    def summary(self) -> dict[str, object]:
        """What the node status file says about the ranks."""
        return {
            "ranks_alive": {str(r): w.proc.pid for r, w in sorted(self.live.items())},
            "ranks_gone": sorted(self.gone),
        }
