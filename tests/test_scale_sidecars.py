"""The whole sidecar at small scale, measured from outside (``benchmarks/bench_sidecars.py``
at 64 to 1,024 nodes has the table): 16 nodes, 4 of them real (a real sidecar process and two
stand-in ranks each), the others the real ``Coordinator``; a bpftrace program counts every path
operation on the run directory, in the kernel. A follower stays within its budget in every
state, the leader within one operation per node per poll while the job steps; the lost node is
named and the hang reported within the benchmark's goals."""

from __future__ import annotations

import os
import shutil

import pytest

from benchmarks.bench_sidecars import NODE_TIMEOUT, POLL, measure

FOLLOWER_BUDGET = 2.0  # path operations a second, everything included (docs/slurm.md)
# A lost node's last status is read up to a status period late, it is lost node_timeout after
# that read, seen at the leader's next poll; then the others' evidence and the report.
LOST_WITHIN = NODE_TIMEOUT + NODE_TIMEOUT / 3 + POLL + 3.0
STATES = ["start-up", "steady", "a node lost", "a rank dead", "a hang", "after the end"]


@pytest.mark.fleet
@pytest.mark.skipif(
    shutil.which("bpftrace") is None or os.geteuid() != 0,
    reason="needs bpftrace, as root (apt-get install bpftrace)",
)
def test_a_follower_stays_within_its_budget_in_every_state() -> None:
    costs = measure(16, real=4, windows=10.0)
    assert [c.state for c in costs] == STATES
    for cost in costs:
        assert cost.follower_mean <= FOLLOWER_BUDGET, cost
    steady, lost, hang = costs[1], costs[2], costs[4]
    assert steady.leader_per_node_poll <= 1.0, steady  # its own node's files weigh at 16 nodes
    assert lost.note.startswith("named in") and float(lost.note.split()[2]) <= LOST_WITHIN, lost
    assert hang.note.startswith("stall->report") and float(hang.note.split()[1]) <= 5, hang
