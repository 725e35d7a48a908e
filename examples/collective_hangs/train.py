"""Collective-level hangs for the Flight Recorder analysis (gloo, CPU), one per ``scenario.name``:

mismatch   rank R calls broadcast where the others call all_reduce (same sequence id)
missing    rank R is stuck in its own code and never issues the next all_reduce
subgroup   inside a subgroup of ranks 0-1, rank R (0 or 1) calls broadcast, the other
           all_reduce; the ranks outside it wait in a barrier of the whole world
extra_op   rank R issues one extra all_reduce of int32 on the metrics group: it pairs silently
           with a peer's float all_reduce (same byte count), every later metric is off by one,
           and at the end the ranks deadlock in different groups. The stacks point at the rank
           that is done (it waits in the final barrier); the collective record names rank R.
"""

from __future__ import annotations

import argparse
import datetime
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
        if rank == 0:
            print(step_line(step, scenario["steps"]), flush=True)
    dist.barrier()  # everyone done?
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
