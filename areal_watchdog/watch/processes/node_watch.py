"""One node's part of the job as the sidecar sees it: which ranks and other processes (an AReaL
controller, workers, inference servers) live, which ended, how busy they are, and their evidence
when asked."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from areal_watchdog.evidence.discovery import JobProcess, Scope, discover, helpers
from areal_watchdog.evidence.gather import (
    BUSY_CPU,
    GatherSettings,
    exit_info,
    gather_node,
    gather_workers,
)
from areal_watchdog.evidence.gpu import GpuBackend, IdleTracker, NoGpu
from areal_watchdog.evidence.kernel_readings.counters import Counters, rates, read_counters
from areal_watchdog.evidence.kernel_readings.kernel_wait import WAIT_CALLS, kernel_waits, main_wait
from areal_watchdog.evidence.kernel_readings.log_writes import LogMeter
from areal_watchdog.evidence.kernel_readings.process_movement import IoWindow, ProcessMovement
from areal_watchdog.evidence.kernel_readings.sockets import tcp_bytes
from areal_watchdog.evidence.listeners.flight_recorder import collect
from areal_watchdog.evidence.model import BLOCKED, RUNNING, RankEvidence
from areal_watchdog.evidence.process_tree import TreeMeter, TreeRates, describe_children
from areal_watchdog.evidence.rollout_side.rollout import gather_rollout
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.watch.processes.server_pulse import ServerPulse

DISCOVERY_EVERY = 10  # polls between full environment scans once all local ranks are known
MIN_CPU_WINDOW = 0.2  # seconds of CPU accounting behind a utilisation figure
TEARDOWN_WINDOW_S = 10.0  # a part that ended this close to a server's refusal: a teardown
WINDOWS_KEPT = 64  # the newest I/O rate windows a look carries (a minute at the shipped poll)


@dataclass
class _Watched:
    proc: JobProcess
    handle: psutil.Process
    window: Counters  # the reading the rates are taken from (at least ``MIN_CPU_WINDOW`` old)
    utilization: float | None = None  # cores busy over the last window
    counters: Counters | None = None  # the newest reading (a look reports it)
    windows: deque[IoWindow] = field(default_factory=lambda: deque(maxlen=WINDOWS_KEPT))
    tree: TreeMeter | None = None  # its descendants (DataLoader workers, a copy subprocess)
    logs: LogMeter | None = None  # its stdout, stderr and log files
    parts: frozenset[int] = frozenset()  # the node's other watched processes: not its tree
    kernel_since: float | None = None  # blocked in the kernel at every poll since, idle

    @classmethod
    def start(cls, proc: JobProcess, now: float) -> _Watched | None:
        try:
            handle = psutil.Process(proc.pid)
        except psutil.Error:
            return None
        counters = read_counters(handle, now)
        if counters is None:
            return None
        return cls(
            proc, handle, counters, counters=counters, tree=TreeMeter(proc.pid),
            logs=LogMeter(proc.pid),
        )  # fmt: skip

    def sample(self, now: float) -> bool:
        """Read the counters (CPU time, I/O, context switches), its descendants' too; False
        once the process is gone."""
        try:
            status = self.handle.status()
            if not self.handle.is_running() or status == psutil.STATUS_ZOMBIE:
                return False
        except psutil.Error:
            return False
        counters = read_counters(self.handle, now)
        if counters is None:
            return False
        self.counters = counters
        if now - self.window.at >= MIN_CPU_WINDOW:  # shorter windows give noisy rates
            found = rates(self.window, counters)
            kids = self.tree.window(now, self.parts) if self.tree else TreeRates()
            logged = (self.logs.window() if self.logs else 0) / (counters.at - self.window.at)
            self.utilization = found["cpu"] if found else None
            self.window = counters
            if found and "io" in found:
                io = max(0.0, found["io"] - logged) + kids.io
                disk = max(0.0, found.get("disk", 0.0) - logged) + kids.disk
                self.windows.append(IoWindow(now, io, disk, kids.cpu, logged).rounded())
        moving = self.at_work()
        idle = (self.utilization or 0.0) < BUSY_CPU or status == psutil.STATUS_DISK_SLEEP
        wait = main_wait(self.proc.pid) if idle and not moving else None
        stuck = wait is not None and wait.stuck
        self.kernel_since = (self.kernel_since or now) if stuck else None
        return True

    def at_work(self) -> bool:
        """Its last poll window shows work by it or its descendants (``IoWindow.at_work``)."""
        return bool(self.windows) and self.windows[-1].at_work


@dataclass
class NodeWatch:
    """The processes of one run on one node: ranks by rank, other parts by pid."""

    layout: RunLayout
    scope: Scope
    expected: int  # ranks this node should have
    log: Callable[[str], None] = lambda _m: None
    gpu_backend: GpuBackend = field(default_factory=NoGpu)
    gpus: IdleTracker = field(default_factory=IdleTracker)
    live: dict[int, _Watched] = field(default_factory=dict)
    gone: dict[int, JobProcess] = field(default_factory=dict)
    workers: dict[int, _Watched] = field(default_factory=dict)
    workers_gone: dict[int, JobProcess] = field(default_factory=dict)
    # gone ranks' pids -> whether their exit record says they returned cleanly: a rank writes
    # it before it ends, so it is read once
    returned: dict[int, bool] = field(default_factory=dict)
    polls: int = 0
    pulse: ServerPulse = field(default_factory=ServerPulse)  # do the servers here generate?
    ended_at: dict[int, float] = field(default_factory=dict)  # pid -> when it was seen gone
    server_pids: set[int] = field(default_factory=set)  # the inference servers' pids

    @property
    def node(self) -> str:
        return self.scope.node

    def refresh(self, now: float, force: bool = False) -> None:
        """Find new processes (every poll until every rank was seen, then only now and then: a
        rank that died is not looked for at every poll) and sample the known ones."""
        self.polls += 1
        unseen = len({*self.live, *self.gone}) < self.expected  # start-up: not every rank yet
        if force or unseen or self.polls % DISCOVERY_EVERY == 1:
            # a rank that ended is not looked for in the registrations again
            missing = self.expected - len(self.gone.keys() - self.live.keys())
            found = discover(self.layout, self.scope, missing)
            for rank, proc in found.ranks.items():
                self._adopt(self.live, self.gone, rank, proc, now)
            for pid, proc in found.workers.items():
                self._adopt(self.workers, self.workers_gone, pid, proc, now)
        parts = frozenset(w.proc.pid for w in (*self.live.values(), *self.workers.values()))
        for watched in (*self.live.values(), *self.workers.values()):
            watched.parts = parts
        for rank, watched in list(self.live.items()):
            if not watched.sample(now):
                self.gone[rank] = watched.proc
                self.ended_at[watched.proc.pid] = now
                del self.live[rank]
                self.log(f"{watched.proc.label()} (pid {watched.proc.pid}) exited; "
                         f"{len(self.live)} ranks alive here")  # fmt: skip
        for pid, watched in list(self.workers.items()):
            if not watched.sample(now):
                self.workers_gone[pid] = watched.proc
                self.ended_at[pid] = now
                del self.workers[pid]
                self.log(f"{watched.proc.label()} (pid {pid}) exited")
        self.pulse.addresses = self.servers()
        self.server_pids |= {pid for pid, w in self.workers.items() if w.proc.address}
        if self.pulse.addresses:
            self.pulse.start()  # at the first server found here; once

    @staticmethod
    def _adopt(
        live: dict[int, _Watched], gone: dict[int, JobProcess], key: int, proc: JobProcess,
        now: float,
    ) -> None:  # fmt: skip
        if key in gone and gone[key].pid == proc.pid:
            return  # a zombie not yet reaped by its parent
        if key in live and live[key].proc.pid == proc.pid:
            live[key].proc = proc  # the registration may have arrived since
            return
        watched = _Watched.start(proc, now)
        if watched is not None:
            live[key] = watched

    def all_gone(self) -> None:
        """The node's job ended: whatever is still listed is gone too."""
        for rank, watched in list(self.live.items()):
            self.gone[rank] = watched.proc
        self.live.clear()
        for pid, watched in list(self.workers.items()):
            self.workers_gone[pid] = watched.proc
        self.workers.clear()

    def evidence(self, settings: GatherSettings) -> list[RankEvidence]:
        """A stack from every live rank, exit details for the others, GPU state when known."""
        self.refresh(time.time(), force=True)
        live = {r: w.proc for r, w in self.live.items()}
        items = gather_node(self.layout, self.node, live, dict(self.gone), self.cpu(), settings)
        by_pid = self.gpus.per_pid()
        by_index = {g["index"]: g for g in by_pid.values()} or self.gpus.per_index()
        movements = self.movements()
        for item in items:
            mine = by_pid.get(item.pid) if item.pid is not None else None
            local = by_index.get(item.local_rank) if item.local_rank is not None else None
            item.gpu = mine or local
            item.movement = movements.get(item.pid)
        self.describe_trees(items, settings.timeout)
        return items

    def describe_trees(self, items: list[RankEvidence], timeout: float) -> None:
        """Each live process's kernel wait and its descendants (what a blocked rank waits on:
        the copy it started, its DataLoader workers), as the poll's tree found them."""
        trees = {w.proc.pid: w.tree for w in (*self.live.values(), *self.workers.values())}
        for item in items:
            if item.pid is None or item.state not in (BLOCKED, RUNNING):
                continue
            waits = kernel_waits(item.pid)
            item.kernel_waits = [w.to_dict() for w in waits]
            tree = trees.get(item.pid)
            if tree is not None and tree.pids():
                waited = bool(waits) and waits[0].syscall in WAIT_CALLS
                item.children = describe_children(tree.pids(), tree.cpu, min(timeout, 2.0), waited)

    def worker_evidence(self, settings: GatherSettings) -> list[RankEvidence]:
        """A stack from every other live part of the job here and from the helpers the parts
        started, exits of those that ended."""
        live = [w.proc for w in self.workers.values()]
        parts = {w.proc.pid: w.proc for w in (*self.live.values(), *self.workers.values())}
        live += helpers(self.layout, self.scope, parts)
        items = gather_workers(
            self.layout, live, list(self.workers_gone.values()), self.cpu(), settings
        )
        movements = self.movements()
        for item in items:
            item.movement = movements.get(item.pid)
        self.describe_trees(items, settings.timeout)
        return items

    def movements(self) -> dict[int | None, ProcessMovement]:
        """Each live rank's and worker's movement as its last sample read it (the look's
        refresh, or the poll before), by pid (a look compares them with the look before:
        ``diagnose.movement``)."""
        watched = [*self.live.values(), *self.workers.values()]
        tcp = tcp_bytes({w.proc.pid for w in watched})
        found: dict[int | None, ProcessMovement] = {}
        for process in watched:
            if process.counters is not None:
                since = process.kernel_since
                blocked = round(process.counters.at - since, 2) if since else 0.0
                found[process.proc.pid] = ProcessMovement(
                    process.counters, tuple(process.windows), tcp.get(process.proc.pid), blocked
                )
        return found

    def in_kernel_since(self) -> dict[int, float]:
        """The live ranks blocked in the kernel (D, or asleep in a file operation) at every
        poll with nothing moving, and since when (storage that does not answer:
        ``diagnose.patterns.storage``)."""
        return {r: w.kernel_since for r, w in self.live.items() if w.kernel_since is not None}

    def ranks_at_work(self) -> list[int]:
        """The live ranks whose last poll window shows work by them or their descendants
        (``IoWindow.at_work``): the in-flight sensor's "nothing moving data"."""
        return sorted(r for r, w in self.live.items() if w.at_work())

    def cpu(self) -> dict[int, float]:
        """Recent CPU use by pid."""
        watched = [*self.live.values(), *self.workers.values()]
        return {w.proc.pid: w.utilization for w in watched if w.utilization is not None}

    def sample_gpus(self, now: float) -> None:
        """Sample the node's GPUs (NVML, nvidia-smi, a recording, or nothing)."""
        try:
            samples = self.gpu_backend.sample()
        except Exception as exc:  # noqa: BLE001 - a flaky driver must not stop the watchdog
            self.log(f"GPU sampling failed: {exc}")
            return
        self.gpus.update(samples, {w.proc.pid for w in self.live.values()}, now)

    def finished_ranks(self) -> set[int]:
        """The gone ranks that ended cleanly by their own exit record (code 0, no exception): a
        rank done with its work, not one that left its peers by failing."""
        for proc in self.gone.values():
            if proc.pid not in self.returned:
                info = exit_info(self.layout, proc, "")
                self.returned[proc.pid] = info.code == 0 and not info.exc_type
        return {rank for rank, proc in self.gone.items() if self.returned[proc.pid]}

    def local_ranks(self) -> list[int]:
        """The ranks of this node, live or ended."""
        return sorted({*self.live, *self.gone})

    def pids(self) -> list[int]:
        """Every live process of the job here: the ranks, then the other parts."""
        return [w.proc.pid for w in (*self.live.values(), *self.workers.values())]

    def servers_refusing(self) -> list[str]:
        """The servers here that answered once and refuse connections now, unless the job's
        other parts here are ending too (a teardown stops its servers: a controller that raised
        ends its rollout workers and servers together)."""
        ended = [at for pid, at in self.ended_at.items() if pid not in self.server_pids]
        return [address for address, since in self.pulse.refused().items()
                if not any(at >= since - TEARDOWN_WINDOW_S for at in ended)]  # fmt: skip

    def client_pids(self) -> set[int]:
        """The job's live processes here and their descendants, the servers' own left out:
        whoever may call a server (a rollout worker's process pool sends weight updates)."""
        found: set[int] = set()
        for watched in (*self.live.values(), *self.workers.values()):
            if watched.proc.pid not in self.server_pids:
                found |= {watched.proc.pid, *(watched.tree.pids() if watched.tree else [])}
        return found

    def servers(self) -> list[str]:
        """The inference servers found running here (AReaL starts them without name_resolve
        records in single-controller mode: their command line says where they listen)."""
        return [w.proc.address for w in self.workers.values() if w.proc.address]

    def rollout(self, items: list[RankEvidence], timeout: float) -> list[dict[str, Any]]:
        """Attach each live process's pending asyncio tasks; return the inference-server
        probes."""
        dumps, servers = gather_rollout(self.layout, self.pids(), self.servers(), timeout)
        for item in items:
            if item.pid in dumps:
                item.tasks = dumps[item.pid].get("tasks", [])
                item.tasks_ended = dumps[item.pid].get("ended")
        return servers

    def flight_records(self, timeout: float) -> dict[str, dict[str, Any]]:
        """Each live rank's Flight Recorder trace (keyed by rank as a string, as in JSON)."""
        traces = collect(self.layout, sorted(self.live), timeout)
        return {str(rank): trace for rank, trace in traces.items()}

    def summary(self) -> dict[str, object]:
        """What the node status file says about the processes."""
        return {
            "ranks_alive": {str(r): w.proc.pid for r, w in sorted(self.live.items())},
            "ranks_gone": sorted(self.gone),
            "ranks_done": sorted(self.finished_ranks()),
            "workers_alive": sorted(w.proc.label() for w in self.workers.values()),
            "servers": self.pulse.summary(),
            "servers_refusing": self.servers_refusing(),
            "ranks_in_kernel_since": {str(r): t for r, t in self.in_kernel_since().items()},
            "gpu_use": self.gpu_use(),
        }

    def gpu_use(self) -> dict[str, float] | None:
        """This node's job GPUs at the last sample: mean utilisation, total power (a lane of
        the leader's timeline per node)."""
        last = self.gpus.last
        if not last:
            return None
        power = sum(g.power_w or 0.0 for g in last)
        return {"utilization": round(sum(g.utilization for g in last) / len(last), 1),
                "power_w": round(power, 1)}  # fmt: skip
