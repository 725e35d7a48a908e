"""Find this job's processes on this node: by environment, never by "all python processes".

A process is only ever dumped or signalled once it is verified as one of this job's own: it runs
as the user who owns the run directory (never another user's process, whatever a file says),
and either carries this run's id in its environment or, where the environment may not be read,
runs our rank wrapper and was started when its registration says. The signal for a cooperative
dump is ours (``COOPERATIVE_SIGNAL``), never a number read from a file.

Two kinds of process are found:

- **ranks**, the training world: torchrun ranks (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and the
  run id in their environment; where the environment may not be read, the registration files
  written by our rank wrapper stand in), or, in AReaL's single-controller mode, the workers of
  the role that holds the ranks (``actor``: their ``RANK`` is its worker index, set later over
  HTTP and so in no environment);
- **workers**, every other part of an AReaL job (the controller, rollout workers, inference
  servers, the data service), by their command line (``common.roles``).

On a test cluster where two Slurm "nodes" share one host, ``SLURMD_NODENAME`` (or, outside
Slurm, ``AREAL_WATCHDOG_NODE``) tells them apart. A forked helper (a DataLoader worker, a
process pool) shares its parent's identity and is not counted twice; a child of a part that
inherited ``RANK`` (anything AReaL's actor worker starts after ``/set_env``) is no rank: ranks
are started by torchrun, srun or a scheduler, never by another part of the job.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from areal_watchdog.common.atomic import read_json
from areal_watchdog.common.roles import RANK_WRAPPERS, SIDECAR_MODULE, Identity, identify
from areal_watchdog.evidence.model import HELPER
from areal_watchdog.rundir.layout import (
    COOPERATIVE_SIGNAL,
    ENV_RAYLET,
    ENV_RUN_ID,
    RunLayout,
    node_of,
)
from areal_watchdog.rundir.secure import run_dir_owner

_REGISTRATION = re.compile(r"rank_\d+\.json")
CACHE_LIMIT = 65536  # entries of each cache below before it starts over
_READ: dict[tuple[str, int], object] = {}  # registration records by (path, inode)
_ARMED: set[tuple[str, int, float]] = set()  # (stack file, pid, start) of armed processes
_UNRELATED: set[tuple[str, str, int, float]] = set()  # (run, node, pid, start) of others' processes
SETTLED = 5.0  # seconds after its start a process's environment is taken as final (exec'd)


@dataclass(frozen=True)
class JobProcess:
    """One process of the job on this node."""

    pid: int
    node: str
    create_time: float
    role: str = "rank"  # "rank" for a torchrun rank, else AReaL's role (common.roles)
    rank: int | None = None  # its rank in the training world, when it has one
    index: int | None = None  # AReaL's worker index within the role
    local_rank: int | None = None
    world_size: int | None = None
    address: str | None = None  # inference servers: host:port
    cooperative_signal: int | None = None
    hooked: bool = False  # armed by the sitecustomize hook: its files are kept by pid
    parent_pid: int | None = None  # a helper: the part of the job that started it

    def label(self) -> str:
        """``rank 3``, ``actor 1``, ``inference_server 127.0.0.1:30000``, ``controller``,
        ``helper of pid 12``."""
        if self.role == HELPER:
            return f"helper of pid {self.parent_pid}"
        if self.role == "rank":
            return f"rank {self.rank}"
        return Identity(self.role, self.index, self.address).label()


MAX_HELPERS_PER_PART = 8


@dataclass
class Discovered:
    """The job's processes on one node: the ranks by rank, every other part by pid."""

    ranks: dict[int, JobProcess] = field(default_factory=dict)
    workers: dict[int, JobProcess] = field(default_factory=dict)


@dataclass(frozen=True)
class Scope:
    """Which processes belong to the job: its run, this node, and how its parts are told."""

    run_id: str
    node: str
    world_size: int | None = None  # ranks beyond it are forged records, never watched
    rank_role: str | None = None  # AReaL's role whose workers are the ranks (single controller)
    controller_config: str = ""  # the job config path only the controller holds
    raylet: str | None = None  # on a Ray node: its raylet's pid (Ray's workers carry theirs)


def discover(layout: RunLayout, scope: Scope, expected: int = 0) -> Discovered:
    """Every live, verified process of the run on this node. The environment says it all for
    processes we may read; this node's registration files (on the shared filesystem, by node:
    never the whole job's) are only read when fewer than ``expected`` ranks were found that
    way."""
    owner = run_dir_owner(layout.run_dir)
    found = Discovered()
    for proc in _from_environment(layout, scope, owner):
        if proc.rank is None:
            found.workers[proc.pid] = proc
        else:
            found.ranks[proc.rank] = proc
    if len(found.ranks) < expected:
        for rank, proc in _from_registrations(layout, scope, owner).items():
            found.ranks.setdefault(rank, proc)
    if scope.world_size is not None:
        found.ranks = {r: p for r, p in found.ranks.items() if 0 <= r < scope.world_size}
    return found


def helpers(layout: RunLayout, scope: Scope, parts: dict[int, JobProcess]) -> list[JobProcess]:
    """The Python processes of the run that a part of the job (``parts``, by pid) started and
    that are no part themselves: AReaL's reward process pool, a tool an episode runs, a
    DataLoader worker. Looked for only when evidence is gathered: what they wait in can be the
    hang (a reward function that never returns). Our own sidecars are never helpers."""
    owner = run_dir_owner(layout.run_dir)
    found: dict[int, list[JobProcess]] = {}
    for proc in _children(parts):
        try:
            parent = proc.ppid()
            if parent not in parts or proc.pid in parts or not _ours(proc, owner):
                continue
            argv, env = proc.cmdline(), proc.environ()
            if env.get(ENV_RUN_ID) != scope.run_id or not _is_helper(argv):
                continue
            made = JobProcess(proc.pid, scope.node, proc.create_time(), role=HELPER,
                              index=parts[parent].index, parent_pid=parent)  # fmt: skip
        except (psutil.Error, OSError):
            continue
        found.setdefault(parent, []).append(made)
    return [
        h
        for kids in found.values()
        for h in sorted(kids, key=lambda h: h.pid)[:MAX_HELPERS_PER_PART]
    ]


def _children(parents: dict[int, JobProcess]) -> list[psutil.Process]:
    """The processes these started, from the kernel's list of each one's children: looking
    through every process of the node was some 0.1 s of CPU per answer with 700 of them, and
    64 nodes answering at once on one host waited seconds for one another."""
    if not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists():
        return list(psutil.process_iter())  # a kernel without the lists: every process
    pids: list[str] = []
    for parent in parents:
        for lists in Path(f"/proc/{parent}/task").glob("*/children"):
            with contextlib.suppress(OSError):  # a thread that just ended
                pids += lists.read_text().split()
    children = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            children.append(psutil.Process(int(pid)))
    return children


def _is_helper(argv: list[str]) -> bool:
    """A Python process, and not our sidecar (a Slurm task's standby sidecar is the child of
    the worker the task then runs)."""
    python = bool(argv) and argv[0].rsplit("/", 1)[-1].startswith("python")
    return python and SIDECAR_MODULE not in argv


def _ours(proc: psutil.Process, owner: int) -> bool:
    try:
        return proc.uids().real == owner and proc.uids().effective == owner
    except psutil.Error:
        return False


def _from_registrations(layout: RunLayout, scope: Scope, owner: int) -> dict[int, JobProcess]:
    found: dict[int, JobProcess] = {}
    for record in _registrations(layout.registrations(scope.node)):
        if not isinstance(record, dict) or record.get("run_id") != scope.run_id:
            continue
        if record.get("node") != scope.node:
            continue
        try:
            proc = psutil.Process(int(record["pid"]))
            create_time = proc.create_time()
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.Error, KeyError, ValueError, TypeError):
            continue
        if abs(create_time - float(record.get("started_at", create_time))) > 600:
            continue  # the pid was reused by an unrelated process
        if not _ours(proc, owner) or not _runs_our_wrapper(proc):
            continue  # a forged or stale record naming somebody else's process
        found[int(record["rank"])] = JobProcess(
            pid=proc.pid,
            node=scope.node,
            create_time=create_time,
            rank=int(record["rank"]),
            local_rank=int(record.get("local_rank", 0)),
            world_size=int(record.get("world_size", 1)),
            cooperative_signal=COOPERATIVE_SIGNAL if record.get("cooperative_signal") else None,
        )
    return found


def _registrations(directory: Path) -> list[object]:
    """The registration records of one node: one listing, and a file opened only when it is new
    (a rank writes its registration once, by rename: a new inode), not at every discovery on the
    shared filesystem."""
    try:
        entries = [e for e in os.scandir(directory) if _REGISTRATION.fullmatch(e.name)]
    except OSError:
        return []
    if len(_READ) > CACHE_LIMIT:
        _READ.clear()
    for entry in entries:
        key = (entry.path, entry.inode())
        if key not in _READ:
            _READ[key] = read_json(Path(entry.path))
    return [_READ[(e.path, e.inode())] for e in entries]


def _runs_our_wrapper(proc: psutil.Process) -> bool:
    try:
        return any(arg.startswith(RANK_WRAPPERS) for arg in proc.cmdline()[:4])
    except psutil.Error:
        return False


def _from_environment(layout: RunLayout, scope: Scope, owner: int) -> list[JobProcess]:
    """The run's processes on this node, each with its identity; forked helpers dropped. A
    process whose settled environment says it is no part of the run is not read again (every
    process's environment at every discovery was most of an answer's CPU)."""
    matches: dict[int, tuple[Identity, psutil.Process, dict[str, str]]] = {}
    for proc in psutil.process_iter():
        try:
            key = (scope.run_id, scope.node, proc.pid, proc.create_time())
            if key in _UNRELATED or not _ours(proc, owner):
                continue
            env = proc.environ()
            if env.get(ENV_RUN_ID) != scope.run_id or not _on_node(env, scope):
                if time.time() - key[3] > SETTLED:  # exec'd by now: its environment is final
                    _remember(_UNRELATED, key)
                continue
            who = identify(proc.cmdline(), env, scope.controller_config)
            if who is None and scope.raylet is not None:
                who = _ray_worker_role(layout, scope, proc)
        except (psutil.Error, OSError):
            continue
        if who is not None and who.role != "torchrun":
            matches[proc.pid] = (who, proc, env)
    found = []
    for pid, (who, proc, env) in matches.items():
        try:
            parent, create_time = proc.ppid(), proc.create_time()
        except psutil.Error:
            continue
        if parent in matches and (matches[parent][0] == who or who.role == "rank"):
            continue  # a helper of a part (a DataLoader worker, a tool it runs): not a part
        made = _job_process(layout, scope, who, pid, create_time, env)
        if made is not None:
            found.append(made)
    return found


def _ray_worker_role(layout: RunLayout, scope: Scope, proc: psutil.Process) -> Identity | None:
    """A Ray worker that holds one of AReaL's workers, as its role record says (written by the
    process itself, in our private run directory, since it began)."""
    record = read_json(layout.process_role_record(proc.pid))
    if not isinstance(record, dict) or record.get("run_id") != scope.run_id:
        return None
    role, index, written = record.get("role"), record.get("index"), record.get("time")
    if not isinstance(role, str) or not isinstance(index, int):
        return None
    if not isinstance(written, (int, float)) or written < proc.create_time():
        return None  # an earlier process's, whose pid this one reuses
    return Identity(role, index)


def _on_node(env: dict[str, str], scope: Scope) -> bool:
    """On this node: as Slurm or our launcher says, or, on Ray, started by this node's raylet."""
    if scope.raylet is not None:  # the controller: its driver's raylet (launch.ray.driver)
        return env.get("RAY_RAYLET_PID", env.get(ENV_RAYLET)) == scope.raylet
    return node_of(env, scope.node) == scope.node


def _job_process(
    layout: RunLayout,
    scope: Scope,
    who: Identity,
    pid: int,
    create_time: float,
    env: dict[str, str],
) -> JobProcess | None:
    if who.role == "rank":
        try:
            rank = int(env["RANK"])
            return JobProcess(
                pid=pid,
                node=scope.node,
                create_time=create_time,
                rank=rank,
                local_rank=int(env.get("LOCAL_RANK", "0")),
                world_size=int(env.get("WORLD_SIZE", "1")),
                cooperative_signal=_armed(layout.stack_file(rank), pid, create_time),
            )
        except (KeyError, ValueError):
            return None
    holds_rank = who.role == scope.rank_role and who.index is not None
    return JobProcess(
        pid=pid,
        node=scope.node,
        create_time=create_time,
        role=who.role,
        rank=who.index if holds_rank else None,
        index=who.index,
        local_rank=0 if holds_rank else None,
        world_size=scope.world_size if holds_rank else None,
        address=who.address,
        cooperative_signal=_armed(layout.process_stack_file(pid), pid, create_time),
        hooked=True,
    )


def _remember(cache: set, key: tuple) -> None:
    if len(cache) > CACHE_LIMIT:
        cache.clear()
    cache.add(key)


def _armed(stack_file: Path, pid: int, create_time: float) -> int | None:
    """Our signal, when the process armed its cooperative dump (it opened its stack file in our
    run directory, which nobody else may write). Armed once, armed for its life: the file is
    looked at until it is there, not at every discovery."""
    key = (str(stack_file), pid, create_time)
    if key not in _ARMED:
        if not stack_file.is_file():
            return None
        _remember(_ARMED, key)
    return COOPERATIVE_SIGNAL
