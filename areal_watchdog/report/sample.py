"""A realistic report for ``areal-launch notify-test``: 8 ranks, rank 3 in another collective.

Built through the real pipeline (evidence -> classifier -> report), so what a receiver gets from
the test is exactly what it will get from a real hang.
"""

from __future__ import annotations

import time
from typing import Any

from areal_watchdog.config.model import JobConfig
from areal_watchdog.diagnose.classify import classify
from areal_watchdog.evidence.model import BLOCKED, Evidence, Frame, RankEvidence, ThreadStack
from areal_watchdog.report.build import IncidentContext, build_report, new_incident_id

_TORCH = "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
_TRAIN = "/workspace/areal/trainer/ppo.py"


def _stack(op: str, line: int, caller: str) -> list[ThreadStack]:
    return [
        ThreadStack(
            "MainThread",
            [
                Frame(op, _TORCH, 2800),
                Frame(caller, _TRAIN, line),
                Frame("PPOTrainer.train_step", _TRAIN, 410),
                Frame("main", _TRAIN, 512),
                Frame("<module>", _TRAIN, 530),
            ],
        )
    ]


def sample_report(config: JobConfig) -> dict[str, Any]:
    """A collective_mismatch report for ``config``'s job, marked as a test in its summary."""
    ranks = [
        RankEvidence(
            r,
            f"node{r // 4}",
            40_000 + r,
            r % 4,
            BLOCKED,
            "py-spy",
            _stack("all_reduce", 233, "PPOActor.ppo_update"),
            cpu_utilization=0.0,
        )
        for r in range(8)
    ]
    ranks[3] = RankEvidence(
        3,
        "node0",
        40_003,
        3,
        BLOCKED,
        "py-spy",
        _stack("broadcast", 251, "PPOActor.log_stats"),
        cpu_utilization=0.0,
    )
    evidence = Evidence(world_size=8, ranks=ranks)
    verdict = classify(evidence)
    verdict.summary = f"[TEST from areal-launch notify-test] {verdict.summary}"
    now = time.time()
    ctx = IncidentContext(
        backend="local",
        run_id="notify-test",
        run_dir=str(config.run_dir),
        world_size=8,
        nodes=["node0", "node1"],
        experiment_name=config.experiment_name,
        trial_name=config.trial_name,
        detected_at=now,
        last_progress_at=now - 612.0,
        threshold_s=600.0,
        last_step=118,
    )
    return build_report(new_incident_id(verdict.category, now), verdict, evidence, ctx)
