"""Coordination at 64, 256 and 1,024 nodes x 8 ranks, today's design beside the one before.

The sidecars are stood in by the real ``Coordinator``
(``areal_watchdog.watch.cluster.coordination``) over a real directory, one per simulated node,
ticked once per poll in this process (a node's tick is what its sidecar's loop does with the run
directory: refresh, answer a request, publish). File operations are counted by an audit hook: every
open by path, rename, directory listing, mkdir and unlink, attributed to the node whose tick made
it. Reported:

- file operations a second, in all and per node (follower and leader), at ``poll_interval: 1``;
- stall threshold to ``report.json`` on disk: the leader asks, every follower answers with 8
  ranks of evidence on its next poll (counted as a whole poll interval, plus the slowest
  follower's answer), the leader collects, classifies all ranks with the real classifier and
  writes the report with the real writer;
- time to name a node whose sidecar stops (killed), against ``node_timeout + 5 s``;
- CPU of a follower and of the leader, as a share of one core.

"Before" is the design this release replaces, restated here to be measured in the same run: every
sidecar published every poll and read every node's status and the request file every poll.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import read_json, write_json_atomic
from areal_watchdog.common.secrets.redact import Redactor
from areal_watchdog.diagnose.classify import classify
from areal_watchdog.evidence.gpu import GpuSample
from areal_watchdog.evidence.model import (
    BLOCKED,
    Evidence,
    Frame,
    RankEvidence,
    ThreadStack,
    plain,
)
from areal_watchdog.notify.sinks.slack.message import build_slack_message, check_limits
from areal_watchdog.report.bound import split_ranks
from areal_watchdog.report.build import IncidentContext, build_report, new_incident_id
from areal_watchdog.report.write import write_incident
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.progress.history import GPU_SAMPLES_KEPT, STEPS_KEPT, History
from areal_watchdog.watch.cluster.coordination import Coordinator

RANKS_PER_NODE = 8
COUNTED = {"open", "os.rename", "os.listdir", "os.scandir", "os.mkdir", "os.remove"}


class _Ops:
    """File operations by node, from the interpreter's audit events."""

    def __init__(self) -> None:
        self.current: str | None = None
        self.by_node: Counter[str] = Counter()
        sys.addaudithook(self.hook)

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if self.current is None or event not in COUNTED:
            return
        if event == "open" and not isinstance(args[0], (str, bytes, Path)):
            return  # an open of a descriptor (fdopen) is no lookup
        self.by_node[self.current] += 1


OPS = _Ops()


@dataclass
class _Legacy:
    """The design before this release, as it touched the run directory each poll."""

    layout: RunLayout
    node: str
    nodes: list[str]
    seq: int = 0

    def tick(self) -> None:
        self.seq += 1
        self.layout.status_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.layout.node_status(self.node), {"seq": self.seq})
        for node in self.nodes:
            read_json(self.layout.node_status(node))
        read_json(self.layout.watch_dir / "requests" / "current.json")


@dataclass
class _Cluster:
    """N simulated sidecars over one run directory."""

    n_nodes: int
    node_timeout: float
    root: Path
    coordinators: list[Coordinator] = field(default_factory=list)
    cpu: Counter[str] = field(default_factory=Counter)
    stopped: set[str] = field(default_factory=set)
    answered: dict[str, str] = field(default_factory=dict)  # node -> the last request it answered

    def __post_init__(self) -> None:
        nodes = [f"node{i:04d}" for i in range(self.n_nodes)]
        layout = RunLayout(self.root / "run")
        layout.watch_dir.mkdir(parents=True)
        layout.launch_file.write_text("{}")  # as a launch leaves it
        self.coordinators = [
            Coordinator(layout, "bench", n, list(nodes), self.node_timeout) for n in nodes
        ]

    def tick(self) -> float:
        """One poll of every live sidecar, as its loop would do it; the slowest one's seconds
        (the sidecars of a real job poll in parallel, one a node)."""
        slowest = 0.0
        for coordinator in self.coordinators:
            if coordinator.node in self.stopped:
                continue
            OPS.current = coordinator.node
            started, wall = time.process_time(), time.perf_counter()
            coordinator.refresh()
            request = coordinator.current_request()
            if request is not None and self.answered.get(coordinator.node) != request["id"]:
                coordinator.answer(request["id"], node_evidence(coordinator.node))
                self.answered[coordinator.node] = request["id"]
            coordinator.publish({"state": "watching"})
            self.cpu[coordinator.node] += time.process_time() - started
            slowest = max(slowest, time.perf_counter() - wall)
            OPS.current = None
        return slowest

    @property
    def leader(self) -> Coordinator:
        return self.coordinators[0]


def node_evidence(node: str, per_node: int = RANKS_PER_NODE) -> dict[str, Any]:
    """What one node answers: its ranks blocked in all_reduce (rank 1 of node0001 elsewhere)."""
    base = int(node[4:]) * per_node
    ranks = []
    for local in range(per_node):
        op = "broadcast" if base + local == per_node + 1 else "all_reduce"
        frames = [
            Frame(op, "/v/site-packages/torch/distributed/distributed_c10d.py", 2400),
            Frame("step", "/job/train.py", 88),
            Frame("main", "/job/train.py", 120),
        ]
        rank = RankEvidence(base + local, node, 1000 + local, local, BLOCKED, "py-spy")
        rank.threads = [ThreadStack("MainThread", frames)]
        ranks.append(plain(rank))
    return {"ranks": ranks, "workers": [], "flight_records": {}, "servers": []}


def _per_second(cluster: _Cluster, rounds: int, poll: float) -> dict[str, float]:
    """Steady-state file operations a second: total, a follower's (mean), the leader's."""
    before = Counter(OPS.by_node)
    for _ in range(rounds):
        started = time.monotonic()
        cluster.tick()
        time.sleep(max(0.0, poll - (time.monotonic() - started)))
    seconds = rounds * poll
    delta = {c.node: OPS.by_node[c.node] - before[c.node] for c in cluster.coordinators}
    followers = [v for k, v in delta.items() if k != cluster.leader.node]
    return {
        "total": sum(delta.values()) / seconds,
        "follower": sum(followers) / len(followers) / seconds,
        "leader": delta[cluster.leader.node] / seconds,
    }


def _stall_to_report(cluster: _Cluster, poll: float) -> tuple[float, int, int]:
    """Seconds from the threshold to report.json on disk, its size and the Slack message's.

    The critical path of a real job: the leader's request; a poll interval at most before every
    follower sees it; the slowest follower's answer (they answer in parallel, one a node); the
    leader's collecting, classifying and writing. Measured here one piece at a time."""
    leader = cluster.leader
    started = time.perf_counter()
    request_id = leader.request_evidence("stall")
    asked = time.perf_counter() - started
    slowest_answer = cluster.tick()  # every follower answers on its next poll
    started = time.perf_counter()
    peers = [c.node for c in cluster.coordinators[1:]]
    answers = leader.collect(request_id, peers, timeout=30)
    ranks = [Evidence.rank_from_dict(r) for a in answers.values() for r in a["ranks"]]
    ranks += [Evidence.rank_from_dict(r) for r in node_evidence(leader.node)["ranks"]]
    evidence = Evidence(world_size=len(ranks), ranks=sorted(ranks, key=lambda r: r.rank))
    verdict = classify(evidence)
    nodes = [c.node for c in cluster.coordinators]
    context = IncidentContext("slurm", "bench", str(cluster.root / "run"), len(ranks), nodes)
    report = build_report(new_incident_id(verdict.category), verdict, evidence, context)
    report, by_node = split_ranks(report)
    path = write_incident(cluster.root / "run", report, evidence, Redactor(), by_node)
    took = asked + poll + slowest_answer + time.perf_counter() - started
    size = (path / "report.json").stat().st_size
    message = build_slack_message(report)
    assert not check_limits(message), check_limits(message)
    slack = len(json.dumps(message))
    assert verdict.culprit_ranks == [RANKS_PER_NODE + 1], verdict.summary
    return took, size, slack


def _time_to_name_a_lost_node(cluster: _Cluster, poll: float) -> float:
    """Stop one follower's sidecar; seconds until the leader names it lost."""
    victim = cluster.coordinators[len(cluster.coordinators) // 2].node
    cluster.stopped.add(victim)
    killed = time.monotonic()
    while victim not in cluster.leader.lost_nodes(finished=set()):
        started = time.monotonic()
        cluster.tick()
        time.sleep(max(0.0, poll - (time.monotonic() - started)))
        if time.monotonic() - killed > 10 * cluster.node_timeout:
            return float("inf")
    return time.monotonic() - killed


def _legacy_ops_per_poll(n_nodes: int, root: Path) -> tuple[float, float]:
    """Today's-before design: file operations in one poll of every sidecar (total, per node)."""
    nodes = [f"node{i:04d}" for i in range(n_nodes)]
    layout = RunLayout(root / "legacy")
    legacy = [_Legacy(layout, n, nodes) for n in nodes]
    for sidecar in legacy:  # every status exists before the measured poll
        sidecar.tick()
    before = sum(OPS.by_node.values())
    for sidecar in legacy:
        OPS.current = f"legacy-{sidecar.node}"
        sidecar.tick()
        OPS.current = None
    total = sum(OPS.by_node.values()) - before
    return float(total), total / n_nodes


def run_scale_benchmarks(quick: bool = False) -> list:
    """Rows for the table: per N, file operations, stall-to-report, lost node, CPU."""
    node_timeout = 3.0 if quick else 10.0
    poll = 1.0
    sizes = (64, 256) if quick else (64, 256, 1024)
    rows = []
    for n_nodes in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            cluster = _Cluster(n_nodes, node_timeout, Path(tmp))
            for _ in range(2):  # every node publishes once and learns the leader
                cluster.tick()
            cluster.cpu.clear()
            rates = _per_second(cluster, rounds=int(2 * node_timeout) if quick else 12, poll=poll)
            steady = int(2 * node_timeout) if quick else 12
            follower_cpu = sum(v for k, v in cluster.cpu.items() if k != cluster.leader.node)
            follower_cpu /= (n_nodes - 1) * steady * poll
            leader_cpu = cluster.cpu[cluster.leader.node] / (steady * poll)
            to_report, report_size, slack_size = _stall_to_report(cluster, poll)
            lost = _time_to_name_a_lost_node(cluster, poll)
            legacy_total, legacy_node = _legacy_ops_per_poll(n_nodes, Path(tmp))
        rows.append(
            (
                f"{n_nodes} x {RANKS_PER_NODE}",
                f"{rates['total']:.0f} ({legacy_total:.0f})",
                f"{rates['follower']:.2f} ({legacy_node:.0f})",
                f"{rates['leader']:.1f}",
                f"{to_report:.2f}",
                f"{lost:.1f} (<= {node_timeout + 5:g})",
                f"{follower_cpu * 100:.3f}% / {leader_cpu * 100:.2f}%",
                f"{report_size / 1e3:.0f} kB / {slack_size / 1e3:.1f} kB",
            )
        )
    header = (
        "nodes x ranks",
        "fs ops/s total (before)",
        "per follower (before)",
        "leader",
        "stall->report s",
        "lost node named s",
        "CPU follower / leader",
        "report.json / Slack",
    )
    title = (
        f"Coordination at scale (poll 1 s, node_timeout {node_timeout:g} s; targets: per-node "
        "ops/s constant and <= 2, report <= 5 s, lost node <= node_timeout + 5 s, follower "
        "CPU < 1%)"
    )
    _timeline_history(sizes[0])  # once before measuring: one-time allocations left out
    history = [_timeline_history(n) for n in sizes]
    history_header = ("nodes x GPUs", "history at capacity", "its polls", "noting a poll")
    history_title = (
        "The timeline's history in the leading sidecar (steps, its node's GPUs, the job's GPUs "
        "at work summed over every status, a lane for each of the first 32 nodes; target: "
        "memory constant in the nodes)"
    )
    return [(title, rows, header), (history_title, history, history_header)]


def _timeline_history(n_nodes: int, gpus: int = 8) -> tuple[str, ...]:
    """Fill the rings to capacity as a leader's polls would; its memory and a poll's cost."""
    samples = [GpuSample(i, f"GPU-{i}", 97.0, 1e3, 8e4, 600.0, 700.0) for i in range(gpus)]
    use = {"utilization": 97.0, "power_w": 4800.0}
    pace = {"gpus": gpus, "gpus_working": gpus}
    statuses = [{"node": f"n{i:04d}", "pace": pace, "gpu_use": use} for i in range(n_nodes)]
    polls = max(STEPS_KEPT, GPU_SAMPLES_KEPT)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    history, started = History("node0000"), time.perf_counter()
    for poll in range(polls):
        history.note_step(poll, float(poll))
        history.note_gpus(float(poll), samples)
        history.note_job_gpus(float(poll), statuses)
    per_poll = (time.perf_counter() - started) / polls
    size = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return (f"{n_nodes} x {gpus}", f"{size / 1024:.0f} KiB", str(polls), f"{per_poll * 1e3:.2f} ms")
