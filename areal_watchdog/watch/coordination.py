"""How the sidecars of one job work together through the shared run directory.

Every sidecar publishes its node's status (``watchdog/status/<node>.json``) every poll. The
leader is the first node, in the job's node order, whose status is still moving; when it stops
moving, the next one takes over. The leader asks every node for evidence through one well-known
file (``watchdog/requests/current.json``), each node answers with
``watchdog/evidence/<request>/<node>.json``, and the leader waits a bounded time.

Built for shared filesystems such as NFS:

- a node is judged by whether its status *changes* (a counter), timed by the reader's own clock,
  so clock skew between nodes does not matter and attribute caching only delays a verdict;
- readers open files by known names (NFS's close-to-open consistency revalidates them) instead of
  relying on directory listings;
- every file is written to a temporary name and renamed, and a half-written or unreadable file
  reads as absent;
- writing an incident is claimed with an exclusive create (``O_EXCL``), so two sidecars that both
  believe they lead cannot report the same event twice.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import read_json, write_json_atomic
from areal_watchdog.rundir.layout import RunLayout


@dataclass
class _Seen:
    seq: int
    changed_at: float  # by this reader's clock


@dataclass
class Coordinator:
    """One node's view of its peers."""

    layout: RunLayout
    run_id: str
    node: str
    nodes: list[str]
    node_timeout: float = 10.0
    dynamic: bool = False  # nodes join by publishing (AReaL's jobs land where Slurm puts them)
    seq: int = 0
    seen: dict[str, _Seen] = field(default_factory=dict)
    started_at: float = field(default_factory=time.monotonic)
    scanned_at: float = 0.0

    def publish(self, status: dict[str, Any]) -> None:
        """Write this node's status; the counter tells readers it is alive."""
        self.seq += 1
        record = {
            **status,
            "run_id": self.run_id,
            "node": self.node,
            "seq": self.seq,
            "time": time.time(),
        }
        try:
            self.layout.status_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.layout.node_status(self.node), record)
        except OSError:
            pass

    def read_status(self, node: str) -> dict[str, Any] | None:
        record = read_json(self.layout.node_status(node))
        if isinstance(record, dict) and record.get("run_id") == self.run_id:
            return record
        return None

    def refresh(self) -> dict[str, dict[str, Any]]:
        """Read every node's status and note which counters moved."""
        now = time.monotonic()
        if self.dynamic and now - self.scanned_at >= self.node_timeout / 4:
            self.scanned_at = now
            self.join_new_nodes()
        statuses = {}
        for node in self.nodes:
            record = self.read_status(node)
            if record is None:
                continue
            statuses[node] = record
            seq = int(record.get("seq", 0))
            seen = self.seen.get(node)
            if seen is None or seen.seq != seq:
                self.seen[node] = _Seen(seq, now)
        return statuses

    def join_new_nodes(self) -> None:
        """Nodes that published a status since the last look join the job, after the known
        ones (the first node, the leader, stays first)."""
        with contextlib.suppress(OSError):
            for path in sorted(self.layout.status_dir.glob("*.json")):
                if path.stem not in self.nodes and self.read_status(path.stem) is not None:
                    self.nodes.append(path.stem)

    def alive(self, node: str, within: float | None = None) -> bool:
        """This node, or a node whose status moved within ``within`` seconds (default
        ``node_timeout``; a node never seen counts from this sidecar's start)."""
        if node == self.node:
            return True
        seen = self.seen.get(node)
        reference = seen.changed_at if seen else self.started_at
        return time.monotonic() - reference <= (self.node_timeout if within is None else within)

    def lost_nodes(self, finished: set[str]) -> list[str]:
        """Nodes whose sidecar stopped publishing without finishing."""
        return [n for n in self.nodes if n not in finished and not self.alive(n)]

    def leader(self) -> str:
        """The first node in job order that is alive."""
        for node in self.nodes:
            if self.alive(node):
                return node
        return self.node

    def is_leader(self) -> bool:
        return self.leader() == self.node

    # ------------------------------------------------------------- evidence
    def request_evidence(self, trigger: str) -> str:
        request_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
        (self.layout.watch_dir / "requests").mkdir(parents=True, exist_ok=True)
        write_json_atomic(
            self._request_file(),
            {
                "run_id": self.run_id,
                "id": request_id,
                "trigger": trigger,
                "by": self.node,
                "time": time.time(),
            },
        )
        return request_id

    def current_request(self) -> dict[str, Any] | None:
        record = read_json(self._request_file())
        if isinstance(record, dict) and record.get("run_id") == self.run_id:
            return record
        return None

    def answer(self, request_id: str, payload: dict[str, Any]) -> None:
        directory = self.layout.watch_dir / "evidence" / request_id
        directory.mkdir(parents=True, exist_ok=True)
        write_json_atomic(directory / f"{self.node}.json", {"node": self.node, **payload})

    def collect(
        self, request_id: str, nodes: list[str], timeout: float, poll: float = 0.05
    ) -> dict[str, dict[str, Any]]:
        """The answers that arrive from ``nodes`` within ``timeout`` seconds."""
        directory = self.layout.watch_dir / "evidence" / request_id
        deadline = time.monotonic() + timeout
        answers: dict[str, dict[str, Any]] = {}
        while True:
            for node in nodes:
                if node not in answers:
                    record = read_json(directory / f"{node}.json")
                    if isinstance(record, dict):
                        answers[node] = record
            if len(answers) == len(nodes) or time.monotonic() >= deadline:
                return answers
            time.sleep(poll)

    def claim(self, key: str) -> bool:
        """True for exactly one caller per key across all nodes (an exclusive create). When the
        claim cannot be written at all (a full disk, a deleted run directory) the caller reports
        anyway: a duplicate report is better than none."""
        directory = self.layout.watch_dir / "claims"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(
                directory / key, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600
            )
        except FileExistsError:
            return False
        except OSError:
            return True
        with contextlib.suppress(OSError), os.fdopen(fd, "w") as fh:
            fh.write(self.node)
        return True

    def _request_file(self) -> Path:
        return self.layout.watch_dir / "requests" / "current.json"
