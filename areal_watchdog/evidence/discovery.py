"""Find this job's rank processes on this node: by environment, never by "all python processes".

A rank process carries ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and the run id the launcher
exported (``AREAL_WATCHDOG_RUN_ID``); on a test cluster where two Slurm "nodes" share one host,
``AREAL_WATCHDOG_NODE`` tells them apart. Where the environment may not be read (another user,
no ptrace rights), the registration files written by ``rank_main`` stand in.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from areal_watchdog.common.atomic import read_json
from areal_watchdog.rundir.layout import ENV_NODE, ENV_RUN_ID, RunLayout


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


def discover(layout: RunLayout, run_id: str, node: str) -> dict[int, RankProcess]:
    """Every live rank process of run ``run_id`` on ``node``, keyed by global rank."""
    found = _from_registrations(layout, run_id, node)
    for proc in _from_environment(run_id, node):
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
    return found


def _from_registrations(layout: RunLayout, run_id: str, node: str) -> dict[int, RankProcess]:
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
        found[int(record["rank"])] = RankProcess(
            rank=int(record["rank"]),
            local_rank=int(record.get("local_rank", 0)),
            world_size=int(record.get("world_size", 1)),
            pid=proc.pid,
            node=node,
            create_time=create_time,
            cooperative_signal=record.get("cooperative_signal"),
        )
    return found


def _from_environment(run_id: str, node: str) -> list[RankProcess]:
    matches: dict[int, tuple[dict[str, str], psutil.Process]] = {}
    for proc in psutil.process_iter():
        try:
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
