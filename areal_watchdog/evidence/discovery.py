"""Find this job's rank processes on this node: by environment, never by "all python processes".

A process is only ever dumped or signalled once it is verified as one of this job's own: it runs
as the user who owns the run directory (never another user's process, whatever a file says),
and either carries this run's id in its environment or, where the environment may not be read,
runs our rank wrapper and was started when its registration says. The signal for a cooperative
dump is ours (``COOPERATIVE_SIGNAL``), never a number read from a file.

A rank process carries ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and the run id the launcher
exported (``AREAL_WATCHDOG_RUN_ID``); on a test cluster where two Slurm "nodes" share one host,
``AREAL_WATCHDOG_NODE`` tells them apart. Where the environment may not be read (another user,
no ptrace rights), the registration files written by ``rank_main`` stand in.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

from areal_watchdog.common.atomic import read_json
from areal_watchdog.rundir.layout import COOPERATIVE_SIGNAL, ENV_NODE, ENV_RUN_ID, RunLayout

WRAPPERS = ("areal_watchdog.rank.main", "areal_watchdog.rank_main")


@dataclass(frozen=True)
class RankProcess:
    """One rank process of the job on this node."""

    rank: int
    local_rank: int
    world_size: int
    pid: int
    node: str
    create_time: float
    cooperative_signal: int | None = None


def discover(
    layout: RunLayout, run_id: str, node: str, world_size: int | None = None
) -> dict[int, RankProcess]:
    """Every live, verified rank process of run ``run_id`` on ``node``, keyed by global rank."""
    owner = _owner(layout)
    found = _from_registrations(layout, run_id, node, owner)
    for proc in _from_environment(run_id, node, owner):
        known = found.get(proc.rank)
        signal = known.cooperative_signal if known and known.pid == proc.pid else None
        found[proc.rank] = RankProcess(
            proc.rank,
            proc.local_rank,
            proc.world_size,
            proc.pid,
            proc.node,
            proc.create_time,
            signal,
        )
    if world_size is not None:
        found = {r: p for r, p in found.items() if 0 <= r < world_size}
    return found


def _owner(layout: RunLayout) -> int:
    """The uid whose processes may be the job's: the run directory's owner."""
    try:
        return layout.run_dir.stat().st_uid
    except OSError:
        return os.geteuid()


def _ours(proc: psutil.Process, owner: int) -> bool:
    try:
        return proc.uids().real == owner and proc.uids().effective == owner
    except psutil.Error:
        return False


def _from_registrations(
    layout: RunLayout, run_id: str, node: str, owner: int
) -> dict[int, RankProcess]:
    found: dict[int, RankProcess] = {}
    if not layout.ranks_dir.is_dir():
        return found
    for path in layout.ranks_dir.glob("rank_*.json"):
        if path.name.endswith(".exit.json"):
            continue
        record = read_json(path)
        if not isinstance(record, dict) or record.get("run_id") != run_id:
            continue
        if record.get("node") != node:
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
        found[int(record["rank"])] = RankProcess(
            rank=int(record["rank"]),
            local_rank=int(record.get("local_rank", 0)),
            world_size=int(record.get("world_size", 1)),
            pid=proc.pid,
            node=node,
            create_time=create_time,
            cooperative_signal=COOPERATIVE_SIGNAL if record.get("cooperative_signal") else None,
        )
    return found


def _runs_our_wrapper(proc: psutil.Process) -> bool:
    try:
        return any(arg.startswith(WRAPPERS) for arg in proc.cmdline()[:4])
    except psutil.Error:
        return False


def _from_environment(run_id: str, node: str, owner: int) -> list[RankProcess]:
    matches: dict[int, tuple[dict[str, str], psutil.Process]] = {}
    for proc in psutil.process_iter():
        try:
            if not _ours(proc, owner):
                continue
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if env.get(ENV_RUN_ID) != run_id or "RANK" not in env:
            continue
        if env.get(ENV_NODE, node) != node:
            continue
        matches[proc.pid] = (env, proc)
    ranks = []
    for pid, (env, proc) in matches.items():
        try:
            parent = proc.ppid()
            create_time = proc.create_time()
        except psutil.Error:
            continue
        if parent in matches and matches[parent][0].get("RANK") == env.get("RANK"):
            continue  # a worker process forked by the rank (DataLoader), not the rank itself
        try:
            ranks.append(
                RankProcess(
                    rank=int(env["RANK"]),
                    local_rank=int(env.get("LOCAL_RANK", "0")),
                    world_size=int(env.get("WORLD_SIZE", "1")),
                    pid=pid,
                    node=node,
                    create_time=create_time,
                )
            )
        except ValueError:
            continue
    return ranks
