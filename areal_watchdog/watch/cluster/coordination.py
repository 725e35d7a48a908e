"""How the sidecars of one job work together through the shared run directory, at a cost per
node that does not grow with the number of nodes.

Every sidecar publishes its node's status (``watchdog/status/<node>.json``), but only as often
as liveness needs: every ``node_timeout / 3`` (``PUBLISH_FRACTION``), or at once when something a
peer must know changed (the node's job ended, an evidence request). The leader is the first node,
in the job's node order, whose status is still moving.

- A **follower** reads one file: the status of the node it believes leads, every poll around
  the stall threshold (when the leader may ask for evidence any moment) and once that status
  has not moved for two periods (the last before a verdict), else once a status period. That
  status carries the leader's current evidence request, so no other file is polled. A status
  moves on from a thread of its own while its sidecar is busy (``status_keeper``). Only while
  the leader it watches stays silent does it look further down the order (one more file per
  look), and takes over when every node before it is silent.
- The **leader** reads every node's status every ``node_timeout / 3``, a share of them each
  poll, and every poll the few whose status missed two periods: a node whose status has not
  moved for ``node_timeout`` is lost, named within ``node_timeout`` plus one period and a
  poll of its last status (14.3 s at the defaults).

So at 1,024 nodes and ``poll_interval: 1`` a follower does about 1.6 file operations a second
(one read a poll, a write and a rename every 3.3 s) where it used to read all 1,024 statuses a
poll (``benchmarks/bench_scale.py``; docs/slurm.md has the table).

Built for shared filesystems such as NFS:

- a node is judged by whether its status *changes* (a counter), timed by the reader's own clock,
  so clock skew between nodes does not matter and attribute caching only delays a verdict;
- readers open files by known names (NFS's close-to-open consistency revalidates them) instead of
  relying on directory listings, but for joining nodes (AReaL on Slurm) and collecting evidence;
- every file is written to a temporary name and renamed, and a half-written or unreadable file
  reads as absent;
- writing an incident is claimed with an exclusive create (``O_EXCL``), so two sidecars that both
  believe they lead cannot report the same event twice.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import (
    json_text,
    read_json,
    write_json_atomic,
    write_text_in_place,
)
from areal_watchdog.rundir.layout import RunLayout

ENDED_STATES = ("ending", "finished")  # a node that says so is not lost when it falls silent
PUBLISH_FRACTION = 3  # a status is rewritten every node_timeout / 3: two may be missed
# A peer's sidecar may first speak this long after ours started: each starts on its own node
# (a Ray actor waiting for a cold worker, an srun step on a busy node; CI once had a Ray node's
# start 10 s behind the head's under load, and it was named lost before the first step).
FIRST_STATUS_GRACE_S = 60.0
COLLECT_POLL_MAX = 0.25  # seconds between two looks for evidence answers, at most
READERS = 8  # statuses and answers read side by side: round trips on a network filesystem


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
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    started_at: float = field(default_factory=time.monotonic)
    published_at: float = -1e9
    scanned_at: float = -1e9  # the leader's last scan (``_scan``)
    scan_cursor: int = 0  # the next node it reads
    scan_owed: float = 0.0  # the reads it owes, fractions kept
    joined_at: float = -1e9  # the leader's last look for nodes joining (``dynamic``)
    listed_at: float = -1e9  # the last listing of the status folder (``_published``)
    listed: set[str] = field(default_factory=set)
    request: dict[str, Any] | None = None  # ours, as leader: carried in our status
    last_status: dict[str, Any] = field(default_factory=dict)
    leading: str = ""  # the leader, as the last refresh found it
    publishing: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def interval(self) -> float:
        """How often a status is written, and how often the leader reads them all."""
        return self.node_timeout / PUBLISH_FRACTION

    # ----------------------------------------------------------------- status
    def publish(self, status: dict[str, Any], force: bool = False) -> bool:
        """Write this node's status when it is due (or ``force``); True if it was written.
        The counter tells readers the node is alive. Thread-safe (``status_keeper``)."""
        with self.publishing:
            if not force and not self.due():
                return False
            return self._write(status)

    def keep_alive(self) -> bool:
        """The last status written again when due, by a sidecar busy in one long step: the node
        stays alive to its peers (what it says is a step old: a status period at most, as a
        reader's view of it is anyway)."""
        with self.publishing:
            if not self.seq or not self.due():
                return False
            return self._write(self.last_status)

    def _write(self, status: dict[str, Any]) -> bool:
        self.last_status = status
        self.seq += 1
        record = {
            **status,
            "run_id": self.run_id,
            "node": self.node,
            "seq": self.seq,
            "time": time.time(),
            "request": self.request,
        }
        self.published_at = time.monotonic()
        path = self.layout.node_status(self.node)
        try:
            try:
                write_json_atomic(path, record)
            except FileNotFoundError:  # the first status of the job: make its folder
                if not self.layout.launch_file.exists():
                    return False  # the run directory is gone: never made again from here
                path.parent.mkdir(parents=True, exist_ok=True)
                write_json_atomic(path, record)
        except OSError:
            return False
        return True

    def read_status(self, node: str) -> dict[str, Any] | None:
        record = read_json(self.layout.node_status(node))
        if isinstance(record, dict) and record.get("run_id") == self.run_id:
            return record
        return None

    def refresh(self, closely: bool = True) -> dict[str, dict[str, Any]]:
        """Read what this node needs this poll (see the module's docstring); the statuses
        known, each as last read. Not ``closely``, a follower reads the leader's status only
        when its own is due (the request the leader may put there comes that late at most), or
        every poll once it has not moved for two status periods: a leader is judged lost on
        what was read within a poll, not a period, of the verdict."""
        now = time.monotonic()
        for node in self.nodes[: self.nodes.index(self.node)]:
            quiet = not self.alive(node, within=self.node_timeout - self.interval)
            if closely or quiet or self.due() or node not in self.statuses:
                self._read(node, now)  # the node that leads; the next only while it is silent
            if self.alive(node):
                self.leading = node
                return self.statuses
        self.leading = self.node  # every node before us is silent (or none is): we lead
        self._scan(now)
        return self.statuses

    def _scan(self, now: float) -> None:
        """The leader's look at every node once per ``interval``, spread over its polls: each
        poll reads the share of the nodes that the time since the last poll is of the interval
        (a whole look at once stretched one poll to 1.17 s at 1,024 nodes on local disk, and
        the stall and lost-node checks waited behind it)."""
        elapsed = min(now - self.scanned_at, self.interval)
        if self.dynamic and now - self.joined_at >= self.interval:
            self.joined_at = now
            self.join_new_nodes(now)
        self.scanned_at = now
        peers = [n for n in self.nodes if n != self.node]
        if not peers:
            return
        self.scan_owed = min(len(peers), self.scan_owed + len(peers) * elapsed / self.interval)
        share = [peers[(self.scan_cursor + i) % len(peers)] for i in range(int(self.scan_owed))]
        self._read_many([*share, *self._quiet(peers, set(share))], now)
        self.scan_cursor = (self.scan_cursor + len(share)) % len(peers)
        self.scan_owed -= int(self.scan_owed)

    def _quiet(self, peers: list[str], reading: set[str]) -> list[str]:
        """Peers whose status missed two periods, read every poll until they move or are lost:
        a node killed just after the leader's read of it was named up to a whole period late
        (``node_timeout`` plus one to two periods, 16 s on NFS), now within a poll of it."""
        within = self.node_timeout - self.interval
        return [
            n for n in peers if n not in reading and n in self.seen and not self.alive(n, within)
        ]

    def read_all(self) -> dict[str, dict[str, Any]]:
        """Every node's status now (a sidecar whose job is ending and must tell a silent peer
        from one that only has not spoken yet; a leader that must know before it reports)."""
        now = time.monotonic()
        if self.dynamic:
            self.join_new_nodes(now)
        self._read_many([n for n in self.nodes if n != self.node], now)
        return self.statuses

    def due(self) -> bool:
        """Time to publish again (and to look at what only matters that often)."""
        return time.monotonic() - self.published_at >= self.interval

    def _read(self, node: str, now: float) -> None:
        self._read_many([node], now)

    def _read_many(self, nodes: list[str], now: float) -> None:
        """Read these nodes' statuses, ``READERS`` at a time when there are several: each is a
        few round trips on a network filesystem (a leader's share of 1,024 nodes one after the
        other stretched its poll past a second on the sshfs stand-in)."""
        # Not opened by name before it exists: NFS would remember it absent.
        readable = [n for n in nodes if n in self.seen or n in self._published(now)]
        if len(readable) > 1:
            with ThreadPoolExecutor(READERS) as pool:
                records = list(pool.map(self.read_status, readable))
        else:
            records = [self.read_status(n) for n in readable]
        for node, record in zip(readable, records, strict=True):
            self._take(node, record, now)

    def _take(self, node: str, record: dict[str, Any] | None, now: float) -> None:
        if record is None:
            return
        self.statuses[node] = record
        seq = int(record.get("seq", 0))
        seen = self.seen.get(node)
        if seen is None or seen.seq != seq:
            self.seen[node] = _Seen(seq, now)

    def _published(self, now: float) -> set[str]:
        """The nodes with a status file, listed at most once a look (``now``): a listing is
        revalidated on NFS (close-to-open), a name looked up before it existed is not (its
        absence is cached until the folder's attributes expire, up to ``acdirmax``)."""
        if self.listed_at != now:
            self.listed_at, self.listed = now, _listed(self.layout.status_dir)
        return self.listed

    def join_new_nodes(self, now: float) -> None:
        """Nodes that published a status since the last look join the job, after the known
        ones (the first node, the leader, stays first), seen now: a node that joined and waited
        for its turn in the leader's scan counted as silent since this sidecar started, and was
        reported lost at once."""
        for node in sorted(self._published(now) - set(self.nodes)):
            self._read(node, now)
            if node in self.seen:
                self.nodes.append(node)

    def alive(self, node: str, within: float | None = None) -> bool:
        """This node, or a node whose status moved within ``within`` seconds (default
        ``node_timeout``); a node never seen, until ``FIRST_STATUS_GRACE_S`` after this
        sidecar's start (at least that long)."""
        if node == self.node:
            return True
        limit = self.node_timeout if within is None else within
        seen = self.seen.get(node)
        if seen is None:
            return time.monotonic() - self.started_at <= max(limit, FIRST_STATUS_GRACE_S)
        return time.monotonic() - seen.changed_at <= limit

    def lost_nodes(self, finished: set[str]) -> list[str]:
        """Nodes whose sidecar stopped publishing without finishing."""
        return [n for n in self.nodes if n not in finished and not self.alive(n)]

    def leader(self) -> str:
        """The first node in job order that was alive at the last refresh (decided there, on
        what was read there: never on nodes this sidecar has not looked at)."""
        return self.leading or self.nodes[0]

    def is_leader(self) -> bool:
        return self.leader() == self.node

    # ------------------------------------------------------------- evidence
    def request_evidence(self, trigger: str) -> str:
        """Ask every node for its evidence: the request rides in our status, written now. The
        answers' folder is made first, here: on NFS a look at a name that did not exist yet is
        remembered (``lookupcache``) until the parent's cached attributes expire, up to
        ``acdirmax`` (60 s), and ``collect`` would list nothing that long."""
        request_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
        with contextlib.suppress(OSError):  # a full disk: the followers make it when they answer
            (self.layout.watch_dir / "evidence" / request_id).mkdir(parents=True, exist_ok=True)
        self.request = {"id": request_id, "trigger": trigger, "by": self.node, "time": time.time()}
        self.publish(self.last_status, force=True)
        return request_id

    def current_request(self) -> dict[str, Any] | None:
        """The request of the node we follow, as its status last said."""
        leader = self.statuses.get(self.leader()) if not self.is_leader() else None
        request = leader.get("request") if leader else None
        return request if isinstance(request, dict) and request.get("id") else None

    def answer(self, request_id: str, payload: dict[str, Any]) -> None:
        """This node's answer, written in place: ``collect`` takes a half-written one for not
        there yet and reads it again at its next look."""
        directory = self.layout.watch_dir / "evidence" / request_id
        text = json_text({"node": self.node, **payload}, compact=True)
        try:  # the leader made the folder with the request
            write_text_in_place(directory / f"{self.node}.json", text)
        except FileNotFoundError:
            directory.mkdir(parents=True, exist_ok=True)
            write_text_in_place(directory / f"{self.node}.json", text)

    def collect(
        self, request_id: str, nodes: list[str], timeout: float, poll: float = 0.05
    ) -> dict[str, dict[str, Any]]:
        """The answers that arrive from ``nodes`` within ``timeout`` seconds. One directory
        listing per look, then a read per new answer (eight at a time); looks grow sparser (up to
        ``COLLECT_POLL_MAX``) so that a thousand answers cost a thousand reads, not a million.
        The status goes on being published meanwhile: a wait longer than ``node_timeout``
        would otherwise make this node look lost to the nodes it waits for."""
        directory = self.layout.watch_dir / "evidence" / request_id
        deadline = time.monotonic() + timeout
        wanted = set(nodes)
        answers: dict[str, dict[str, Any]] = {}
        with ThreadPoolExecutor(READERS) as pool:
            while True:
                new = sorted(_listed(directory) & (wanted - set(answers)))
                paths = [directory / f"{node}.json" for node in new]
                for node, record in zip(new, pool.map(read_json, paths), strict=True):
                    if isinstance(record, dict):
                        answers[node] = record
                if len(answers) == len(wanted) or time.monotonic() >= deadline:
                    return answers
                self.publish(self.last_status)  # when due
                time.sleep(min(poll, self.interval, max(0.0, deadline - time.monotonic())))
                poll = min(COLLECT_POLL_MAX, poll * 2)

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


def _listed(directory: Path) -> set[str]:
    """The nodes a folder of ``<node>.json`` files (statuses, answers) has a file for."""
    try:
        return {n[: -len(".json")] for n in os.listdir(directory) if n.endswith(".json")}
    except OSError:
        return set()
