"""A report of any size for the sinks' limits: ``world`` ranks in ``groups`` stack groups, one
big group and one per outlier rank, each with a long frame name."""

from __future__ import annotations

from typing import Any

from areal_watchdog.diagnose.classify import classify
from areal_watchdog.evidence.model import BLOCKED, Evidence, Frame, RankEvidence, ThreadStack
from areal_watchdog.report.build import IncidentContext, build_report


def synthetic_report(world: int, groups: int, name: str = "x" * 80) -> dict[str, Any]:
    torch_file = "/v/site-packages/torch/distributed/distributed_c10d.py"
    ranks = []
    for r in range(world):
        site = max(0, r - (world - groups))  # one big group, then one group per outlier rank
        frames = [
            Frame("all_reduce", torch_file, 1),
            Frame(f"layer_{site}_" + name, "/proj/model/very/deep/module.py", 100 + site),
            Frame("train_step", "/proj/train.py", 50),
            Frame("main", "/proj/train.py", 9),
        ]
        ranks.append(
            RankEvidence(
                r, f"node{r // 8}", r, r % 8, BLOCKED, "py-spy", [ThreadStack("MainThread", frames)]
            )
        )
    evidence = Evidence(world_size=world, ranks=ranks)
    ctx = IncidentContext(
        "slurm",
        "rid",
        "/runs/x",
        world,
        [f"node{i}" for i in range(world // 8)],
        "exp",
        "trial",
        last_step=7,
    )
    return build_report(
        "20261122T000000Z-collective_mismatch-abcd", classify(evidence), evidence, ctx
    )
