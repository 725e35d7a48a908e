"""What moved between two looks at a silent job: the second look before an action that ends it.

A slow phase that would have recovered (a checkpoint written to a slow filesystem, a server
saturated by other clients) looks like a hang at the first look. Before ``on_hang: cancel`` ends
the job, the leader looks again a few seconds later and compares:

- a new step (the progress clock moved);
- a process whose working thread was in more than one function over the two looks (a running
  rank is sampled three times a look, so that one in a long computation is seen at several of
  its calls; bare function names only: a rank that spins in one loop is sampled at different
  lines of it, and a look that fell back from py-spy
  (``Trainer.step``) to faulthandler (``step``) sees the same place; neither moved), above the
  outermost wait it is in: a process polling in a wait (AReaL's Ray launcher in
  ``RayLauncher.wait``, asleep or in ``ray.get`` by turns; a trainer in ``prepare_batch``) is
  sampled at different calls below it, and has not moved until it leaves that wait;
- asyncio tasks that ended by returning (episodes that completed); tasks that ended by
  exception are a retry loop against something dead, not movement;
- work an inference server did: tokens generated or requests completed (vLLM's and SGLang's
  counters), however full its queue;
- a process that read or wrote real data between the looks (its own counters: bytes through
  its read and write calls, or to and from storage, above
  ``evidence.kernel_readings.counters.IO_FLOOR`` in more than half of the sidecar's poll windows
  since the first look, so that the one window in which a look's own dumps were written never
  counts): a checkpoint written in one function, a dataset read; or over TCP
  (``evidence.kernel_readings.sockets``: an upload);
- a GPU that worked since the first look (utilisation above the idle level at a power above the
  spin fraction, ``evidence.gpu``), matched to its ranks by process: a silent evaluation on the
  GPU is busy, not hung. A NCCL wait spins at low power and is no movement.

CPU time alone is no movement: a rank spinning forever burns it too (``docs/how-it-works.md``
has the table of what moves). Nor is a moving stack when
both looks name a retry loop (``workflow_failing``): there only a new step or completed work
counts. Nor are completed episodes when a look names damage (``reward_stuck``): those are the
reward timeouts scoring 0. Pure: compares plain data taken from two ``Evidence`` objects.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from areal_watchdog.common.rankset import ranks_phrase
from areal_watchdog.diagnose.one_process.activity import ROLLOUT_CALLS, work_thread
from areal_watchdog.diagnose.one_process.frames import bare
from areal_watchdog.evidence.kernel_readings.counters import real_data
from areal_watchdog.evidence.kernel_readings.process_movement import IoWindow
from areal_watchdog.evidence.model import BLOCKED, RUNNING, Evidence, RankEvidence

# Causes whose processes keep moving while nothing progresses.
RETRY_LOOPS = frozenset({"workflow_failing"})
STACKS_MOVED = "the stacks of pid"  # how ``moved`` names processes whose stacks moved
# Calls that wait by polling: what is below them changes between samples, they do not.
WAITS = ROLLOUT_CALLS | {"wait"}


@dataclass(frozen=True)
class ServerWork:
    """An inference server's counters at one look."""

    time: float
    tokens: float | None
    requests: float | None
    running: float | None
    queued: float | None


@dataclass(frozen=True)
class GpuWork:
    """A rank's GPU at one look: which, its state and power, and when it last worked."""

    index: int
    state: str
    power_w: float | None
    worked_at: float | None


@dataclass(frozen=True)
class Marks:
    """What is compared between the two looks: per process (by pid), its working thread's
    functions and the tasks that completed since the previous look; per server, its work; per
    rank, its GPU."""

    step: int | None
    functions: dict[int, frozenset[tuple[str, ...]]]  # every sample's, of a running rank
    completed: dict[int, int]
    servers: dict[str, ServerWork]
    gpus: dict[int, GpuWork] = field(default_factory=dict)  # rank -> its GPU
    io: dict[int, tuple[IoWindow, ...]] = field(default_factory=dict)  # pid -> its polls' rates
    labels: dict[int, str] = field(default_factory=dict)  # pid -> ``rank 0``, for people
    tcp: dict[int, tuple[float, int]] = field(default_factory=dict)  # pid -> (at, TCP bytes)


def marks(evidence: Evidence, step: int | None) -> Marks:
    """The marks of one look at the job."""
    live = [p for p in evidence.processes() if p.state in (BLOCKED, RUNNING) and p.pid]
    return Marks(
        step,
        {p.pid: _functions(p) for p in live if p.pid},
        {p.pid: (p.tasks_ended or {}).get("ok", 0) for p in live if p.pid},
        {str(s["address"]): _work(s) for s in evidence.servers if s.get("address")},
        {r.rank: _gpu(r.gpu) for r in evidence.ranks if r.gpu and r.state in (BLOCKED, RUNNING)},
        {p.pid: p.movement.io_windows if p.movement else () for p in live if p.pid},
        {p.pid: p.label() for p in live if p.pid},
        {p.pid: tcp for p in live if p.pid and (tcp := _tcp(p)) is not None},
    )


def moved(
    first: Marks, second: Marks, *, steps_only: bool = False, damage: bool = False
) -> list[str]:
    """What moved between the looks, for people; empty when nothing did. ``steps_only``: a
    retry loop, where stacks that change are no movement; ``damage``: completed episodes are
    the damage (rewards scored 0 after a timeout), no movement."""
    found = []
    if second.step is not None and second.step != first.step:
        found.append(f"a new step ({second.step})")
    found += busy_servers(first, second)
    found += busy_gpus(first, second)
    if not steps_only:  # a retry loop writes its failures to its log
        found += busy_io(first, second)
    done = sorted(pid for pid, count in second.completed.items() if count > 0)
    if done and not damage:
        found.append(f"tasks of pid {', '.join(map(str, done[:5]))} completed")
    if steps_only:
        return found
    changed = sorted(stacks_moved(first, second))
    if changed:
        found.append(f"{STACKS_MOVED} {', '.join(map(str, changed[:5]))} changed")
    return found


def stacks_moved(first: Marks, second: Marks) -> set[int]:
    """The processes whose working thread was in more than one function over the looks."""
    return {
        pid
        for pid, functions in second.functions.items()
        if pid in first.functions and len(functions | first.functions[pid]) > 1
    }


def only_stacks_moved(what: list[str]) -> bool:
    """Only stacks moved between the looks: no step, no data, no GPU, no server, no task (a
    livelock moves so; so does an evaluation, which is why time decides)."""
    return bool(what) and all(line.startswith(STACKS_MOVED) for line in what)


def busy_servers(first: Marks, second: Marks) -> list[str]:
    """Servers that generated between the looks: busy, not hung, with their numbers."""
    found = []
    for address, now in sorted(second.servers.items()):
        before = first.servers.get(address)
        if before is None:
            continue
        tokens = _delta(before.tokens, now.tokens)
        requests = _delta(before.requests, now.requests)
        if not tokens and not requests:
            continue
        seconds = max(now.time - before.time, 1e-3)
        rate = f"{tokens / seconds:,.0f} tokens/s" if tokens else f"{requests / seconds:.1f} req/s"
        found.append(
            f"the inference server {address} generated {tokens:,.0f} tokens and completed "
            f"{requests:,.0f} requests in {seconds:.1f} s ({rate}; running "
            f"{_count(now.running)}, queued {_count(now.queued)}): busy, not hung"
        )
    return found


def busy_gpus(first: Marks, second: Marks) -> list[str]:
    """Ranks whose GPU worked since the first look, one line per GPU: ``ranks 0-1 busy (GPU 0
    working at 602 W, shared by ranks 0-1), not hung``."""
    sharing: dict[int, list[int]] = {}
    for rank, gpu in sorted(second.gpus.items()):
        sharing.setdefault(gpu.index, []).append(rank)
    found = []
    for index, ranks in sorted(sharing.items()):
        gpu = second.gpus[ranks[0]]
        before = [first.gpus[r].worked_at for r in ranks if r in first.gpus]
        since = max((w for w in before if w is not None), default=None)
        if gpu.worked_at is None or (since is not None and gpu.worked_at <= since):
            continue
        power = f" at {gpu.power_w:.0f} W" if gpu.power_w is not None else ""
        doing = "working" if gpu.state == "working" else f"worked since, {gpu.state} now"
        shared = f", shared by {ranks_phrase(ranks)}" if len(ranks) > 1 else ""
        found.append(f"{ranks_phrase(ranks)} busy (GPU {index} {doing}{power}{shared}), not hung")
    return found


def busy_io(first: Marks, second: Marks) -> list[str]:
    """Processes that read or wrote real data between the looks, by their own counters, one
    line each: ``rank 0 (pid 7) read or wrote 6.4 MB/s in 3 of 3 polls since the first look
    (a checkpoint, a dataset read): busy, not hung``; or carried it over TCP (an upload)."""
    found = []
    for pid, windows in sorted(second.io.items()):
        if pid not in first.io:
            continue
        since = max((w.end for w in first.io[pid]), default=0.0)
        between = [w for w in windows if w.end > since]
        busy = [w for w in between if w.real_data]
        working = [w for w in between if w.children_work]
        if len(busy) * 2 > len(between) >= 2:  # one window may hold the look's own dumps
            rate = max(
                statistics.median(w.io for w in busy), statistics.median(w.disk for w in busy)
            )
            found.append(
                f"{_who(second, pid)} read or wrote {rate / 1e6:.1f} MB/s in {len(busy)} of "
                f"{len(between)} polls since the first look, its child processes' included (a "
                "checkpoint, a dataset read, a copy): busy, not hung"
            )
        elif len(working) * 2 > len(between):  # a look burns no CPU in a rank's children
            cores = statistics.median(w.children_cpu for w in working)
            found.append(
                f"the child processes of {_who(second, pid)} worked ({cores:.1f} cores in "
                f"{len(working)} of {len(between)} polls since the first look: DataLoader "
                "workers, a subprocess it waits for): busy, not hung"
            )
    return found + _busy_tcp(first, second)


def _busy_tcp(first: Marks, second: Marks) -> list[str]:
    found = []
    for pid, (at, carried) in sorted(second.tcp.items()):
        before = first.tcp.get(pid)
        if before is None or at <= before[0]:
            continue
        rate = max(0, carried - before[1]) / (at - before[0])
        if real_data(rate, 0.0):
            found.append(
                f"{_who(second, pid)} sent or received {rate / 1e6:.2f} MB/s over TCP since the "
                "first look (an upload, a download): busy, not hung"
            )
    return found


def _who(marks_: Marks, pid: int) -> str:
    return f"{marks_.labels.get(pid, f'pid {pid}')} (pid {pid})"


def _tcp(process: RankEvidence) -> tuple[float, int] | None:
    movement = process.movement
    if movement is None or movement.tcp_bytes is None:
        return None
    return movement.at, movement.tcp_bytes


def _gpu(entry: dict[str, Any]) -> GpuWork:
    worked, power = entry.get("worked_at"), entry.get("power_w")
    return GpuWork(
        int(entry.get("index") or 0),
        str(entry.get("state") or "unknown"),
        float(power) if isinstance(power, (int, float)) else None,
        float(worked) if isinstance(worked, (int, float)) else None,
    )


def _delta(before: float | None, after: float | None) -> float:
    if before is None or after is None or after < before:  # a restarted server counts anew
        return 0.0
    return after - before


def _count(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def _work(probe: dict[str, Any]) -> ServerWork:
    def number(key: str) -> float | None:
        value = probe.get(key)
        return float(value) if isinstance(value, (int, float)) else None

    return ServerWork(
        float(probe.get("time") or 0.0),
        number("generated_tokens"),
        number("requests_done"),
        number("running"),
        number("queued"),
    )


def _functions(process: RankEvidence) -> frozenset[tuple[str, ...]]:
    """The working thread's functions, outermost wait and out (frames are innermost first), in
    each of the look's samples of the process."""
    found = set()
    for threads in (process.threads, *process.samples):
        thread = work_thread(replace(process, threads=threads, samples=[]))
        names = [bare(f.name) for f in thread.frames] if thread else []
        waits = [i for i, name in enumerate(names) if name in WAITS]
        found.add(tuple(names[waits[-1] :] if waits else names))
    return frozenset(found)
