"""Collective-level hangs for the Flight Recorder analysis (gloo, CPU), one per ``scenario.name``:

mismatch   rank R calls broadcast where the others call all_reduce (same sequence id)
missing    rank R is stuck in its own code and never issues the next all_reduce
subgroup   inside a subgroup of ranks 0-1, rank R (0 or 1) calls broadcast, the other
           all_reduce; the ranks outside it wait in a barrier of the whole world
extra_op   rank R issues one extra all_reduce of int32 on the metrics group: it pairs silently
           with a peer's float all_reduce (same byte count), every later metric is off by one,
           and at the end the ranks deadlock in different groups. The stacks point at the rank
           that is done (it waits in the final barrier); the collective record names rank R.
moe        MoE-like token routing: every step a legal *uneven* all_to_all_single (each rank
           sends a different number of tokens), then rank R stalls in its own code (an expert
           that never returns): a straggler, not a collective mismatch
pairs      data-parallel pairs (groups [0, 1] and [2, 3]) then a group of every rank: the
           group names and each rank's pg_id differ; rank R (2 or 3) stalls before its pair's
           all_reduce, its partner waits in the pair, the other pair waits in the big group
tie        two ranks meet a fresh group for the first time with different collectives: no
           history tells which one broke the pattern

``scenario.dump_dir`` emulates NCCL's TORCH_NCCL_DUMP_ON_TIMEOUT on gloo (which has none): once
a rank has made no progress for ``scenario.dump_after`` seconds it writes its Flight Recorder
dump as NCCL would (``<dump_dir>/pickle/rank_<r>``), as JSON (``json/rank_<r>.json``) and only
the active entries (``active/rank_<r>``). ``scripts/record-fr-fixtures.py`` uses it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import threading
import time

import torch
import torch.distributed as dist
import yaml


def step_line(step: int, total: int) -> str:
    now = datetime.datetime.now().strftime("%Y%m%d-%H:%M:%S.%f")[:-3]
    return (
        f"(AReaL) {now} StatsLogger INFO: Epoch 1/1 Step {step}/{total} "
        f"Train step {step}/{total} done."
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    with open(parser.parse_args().config) as fh:
        config = yaml.safe_load(fh)
    scenario = {
        "name": "mismatch",
        "rank": 1,
        "step": 3,
        "steps": 6,
        "step_time": 0.1,
        **(config.get("scenario") or {}),
    }
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    progress = DumpOnHang(scenario.get("dump_dir"), float(scenario.get("dump_after", 2)), rank)
    if scenario["name"] in ("moe", "pairs", "tie"):
        run_routing(scenario, rank, progress)
        return
    metrics = dist.new_group(backend="gloo")
    trio = dist.new_group([0, 1, 2], backend="gloo") if dist.get_world_size() >= 3 else None
    culprit = rank == scenario["rank"]
    grads = torch.ones(8)
    for step in range(1, scenario["steps"] + 1):
        time.sleep(scenario["step_time"])
        dist.all_reduce(grads)  # "gradients"
        loss = torch.ones(1)
        if step == scenario["step"]:
            name = scenario["name"]
            if name == "mismatch" and culprit:
                dist.broadcast(loss, src=0, group=metrics)
            elif name == "missing" and culprit:
                time.sleep(10**6)  # a reward function waiting on a dead service
            elif name == "subgroup" and rank in (0, 1, 2):
                if culprit:
                    dist.broadcast(loss, src=0, group=trio)
                else:
                    dist.all_reduce(loss, group=trio)
                dist.all_reduce(loss, group=metrics)
            elif name == "extra_op" and culprit:
                dist.all_reduce(torch.zeros(1, dtype=torch.int32), group=metrics)
        dist.all_reduce(loss, group=metrics)  # "metrics"
        progress.step()
        if rank == 0:
            print(step_line(step, scenario["steps"]), flush=True)
    dist.barrier()  # everyone done?
    dist.destroy_process_group()


def run_routing(scenario: dict, rank: int, progress: DumpOnHang) -> None:
    """The moe, pairs and tie scenarios: groups whose names and pg_ids differ per rank."""
    world = dist.get_world_size()
    pairs = [dist.new_group(r, backend="gloo") for r in ([0, 1], [2, 3])] if world >= 4 else []
    pair = pairs[rank // 2] if pairs else None
    everyone = dist.new_group(backend="gloo")
    fresh = dist.new_group(backend="gloo")
    culprit = rank == scenario["rank"]
    for step in range(1, scenario["steps"] + 1):
        time.sleep(scenario["step_time"])
        hang_now = step == scenario["step"]
        if scenario["name"] == "moe":
            if hang_now and culprit:
                expert_forward_that_never_returns()
            route_tokens(rank, world, step)
        elif scenario["name"] == "pairs":
            if hang_now and culprit:
                expert_forward_that_never_returns()
            dist.all_reduce(torch.ones(4), group=pair)  # data-parallel gradients
            dist.all_reduce(torch.ones(1), group=everyone)  # metrics
        elif hang_now:  # tie: the first use of a fresh group, different on each rank
            if culprit:
                dist.broadcast(torch.ones(2), src=0, group=fresh)
            else:
                dist.all_reduce(torch.ones(2), group=fresh)
        dist.all_reduce(torch.ones(1))  # "loss"
        progress.step()
        if rank == 0:
            print(step_line(step, scenario["steps"]), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def route_tokens(rank: int, world: int, step: int) -> None:
    """A legal uneven all_to_all_single: rank r sends (r + j + step) % 3 + 1 tokens to rank j."""
    send = [(rank + j + step) % 3 + 1 for j in range(world)]
    receive = [(j + rank + step) % 3 + 1 for j in range(world)]
    tokens = torch.full((sum(send), 4), float(rank))
    out = torch.empty(sum(receive), 4)
    dist.all_to_all_single(out, tokens, receive, send)


def expert_forward_that_never_returns() -> None:
    time.sleep(10**6)


class DumpOnHang:
    """NCCL's TORCH_NCCL_DUMP_ON_TIMEOUT, emulated for gloo: one dump per rank once it stalls."""

    def __init__(self, directory: str | None, after: float, rank: int) -> None:
        self.last = time.monotonic()
        if directory:
            args = (directory, after, rank)
            threading.Thread(target=self._watch, args=args, daemon=True).start()

    def step(self) -> None:
        self.last = time.monotonic()

    def _watch(self, directory: str, after: float, rank: int) -> None:
        while time.monotonic() - self.last < after:
            time.sleep(0.1)
        c10d = torch._C._distributed_c10d
        dumps = {
            f"pickle/rank_{rank}": c10d._dump_fr_trace(includeStackTraces=False),
            f"json/rank_{rank}.json": c10d._dump_fr_trace_json(),
            f"active/rank_{rank}": c10d._dump_fr_trace(includeStackTraces=False, onlyActive=True),
        }
        for name, data in dumps.items():
            path = os.path.join(directory, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + ".tmp", "wb") as fh:
                fh.write(data if isinstance(data, bytes) else data.encode())
            os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
