"""Plain data gathered from a job: what each rank was doing when the watchdog looked.

Gathering (py-spy, faulthandler, exit records, logs) produces these objects; the classifier and
the report consume them. Everything round-trips through JSON so recorded evidence can be
replayed into the classifier in tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field, is_dataclass
from typing import Any

from areal_watchdog.evidence.kernel_readings.process_movement import ProcessMovement

# Rank states.
BLOCKED = "blocked"  # alive, stack taken, CPU time not moving
RUNNING = "running"  # alive, stack taken, CPU time moving
EXITED = "exited"  # the process is gone
UNRESPONSIVE = "unresponsive"  # alive, but no stack could be taken
MISSING = "missing"  # part of the world size, never seen on any node
HELPER = "helper"  # the role of a Python process a part of the job started (a reward pool)


@dataclass
class Frame:
    """One stack frame; ``filename`` is the full path as the process saw it."""

    name: str
    filename: str
    line: int

    @property
    def short_filename(self) -> str:
        return short_path(self.filename)


@dataclass
class ThreadStack:
    """The frames of one thread, innermost first, with py-spy's flags (None: not known, as with
    faulthandler)."""

    name: str | None
    frames: list[Frame]
    active: bool | None = None  # py-spy: the thread was running (not idle in a wait) when sampled
    owns_gil: bool | None = None  # py-spy: the thread held the GIL when sampled
    thread_id: int | None = None  # Python's thread identifier (threading.get_ident)


@dataclass
class ExitInfo:
    """How a rank process ended."""

    code: int | None = None  # exit code; negative: killed by that signal
    kind: str = "unknown"  # returned | exit | exception | signal | unknown
    time: float | None = None
    exc_type: str | None = None
    message: str | None = None
    traceback: str | None = None


@dataclass
class RankEvidence:
    """Everything known about one process of the job at detection time: a rank of the training
    world, or (``rank`` None) another part of an AReaL job: its controller, a rollout worker,
    an inference server, the data service."""

    rank: int | None
    node: str = ""
    pid: int | None = None
    local_rank: int | None = None
    state: str = MISSING
    evidence_method: str = "none"  # py-spy | faulthandler | none
    threads: list[ThreadStack] = field(default_factory=list)
    samples: list[list[ThreadStack]] = field(default_factory=list)  # a running rank's later dumps
    exit: ExitInfo | None = None
    cpu_utilization: float | None = None  # cores busy over the last poll interval (1.0 = one core)
    process_status: str | None = None  # psutil's status at dump time ("stopped": SIGSTOPped)
    gpu: dict[str, Any] | None = None  # the rank's GPU at detection: utilisation, power, state
    movement: ProcessMovement | None = None  # its counters at the look, and the polls' before
    error: str | None = None  # why no stack (or no py-spy stack) could be taken
    log_tail: str = ""
    # pending asyncio tasks (rank.asyncio_tasks.tasks)
    tasks: list[dict[str, Any]] = field(default_factory=list)
    tasks_ended: dict[str, int] | None = None  # since its previous task dump: ok, failed, cancelled
    role: str | None = None  # AReaL's role (controller, actor, rollout, inference_server...)
    worker_index: int | None = None  # AReaL worker index within its role
    address: str | None = None  # inference servers: host:port
    cwd: str | None = None  # its working directory: user files are shown relative to it
    parent_pid: int | None = None  # a helper process: the job's process that started it
    # what the kernel says it waits on: its main thread, then any other thread in D state
    # (evidence.kernel_readings.kernel_wait), read for a live process at the look
    kernel_waits: list[dict[str, Any]] = field(default_factory=list)
    children: list[dict[str, Any]] = field(default_factory=list)  # evidence.process_tree

    def label(self) -> str:
        """``rank 3`` (``rank 3 (actor 3)``), ``rollout 0``, ``controller``."""
        part = self.role or ""
        if self.address:
            part += f" {self.address}"
        elif self.worker_index is not None:
            part += f" {self.worker_index}"
        if self.rank is None:
            return part or f"pid {self.pid}"
        return f"rank {self.rank}" + (f" ({part})" if part and self.role != "rank" else "")

    def main_thread(self) -> ThreadStack | None:
        """The thread running the script: named MainThread, else the one rooted in <module>."""
        for thread in self.threads:
            if thread.name == "MainThread":
                return thread
        for thread in self.threads:
            if thread.frames and thread.frames[-1].name == "<module>":
                return thread
        return self.threads[0] if self.threads else None


@dataclass
class Evidence:
    """The whole job as the watchdog saw it when it declared a stall or a failure."""

    world_size: int
    ranks: list[RankEvidence]
    first_step_seen: bool = True
    job_failed: bool = False  # the job's processes ended with a non-zero code
    unanswered_nodes: list[str] = field(default_factory=list)  # no evidence arrived in time
    lost_nodes: list[str] = field(default_factory=list)  # sidecar and ranks vanished
    flight_records: dict[str, dict[str, Any]] = field(default_factory=dict)  # rank -> trace
    servers: list[dict[str, Any]] = field(default_factory=list)  # inference-server probes
    workers: list[RankEvidence] = field(default_factory=list)  # the job's parts without a rank

    def to_dict(self) -> dict[str, Any]:
        return plain(self)

    @staticmethod
    def rank_from_dict(data: dict[str, Any]) -> RankEvidence:
        """One RankEvidence from its ``asdict`` form (as sent between nodes)."""
        item = dict(data)
        item["threads"] = _threads(item.get("threads", []))
        item["samples"] = [_threads(sample) for sample in item.get("samples", [])]
        if item.get("exit") is not None:
            item["exit"] = ExitInfo(**item["exit"])
        item["movement"] = ProcessMovement.from_dict(item.get("movement"))
        return RankEvidence(**item)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Evidence:
        return cls(
            world_size=data["world_size"],
            ranks=[cls.rank_from_dict(r) for r in data["ranks"]],
            first_step_seen=data.get("first_step_seen", True),
            job_failed=data.get("job_failed", False),
            unanswered_nodes=list(data.get("unanswered_nodes", [])),
            lost_nodes=list(data.get("lost_nodes", [])),
            flight_records=dict(data.get("flight_records", {})),
            servers=list(data.get("servers", [])),
            workers=[cls.rank_from_dict(w) for w in data.get("workers", [])],
        )

    def processes(self) -> list[RankEvidence]:
        """Every process seen: the ranks, then the other parts of the job."""
        return [*self.ranks, *self.workers]


def short_path(filename: str) -> str:
    """``.../site-packages/torch/x.py`` -> ``torch/x.py``; user files keep their last two parts."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    parts = filename.replace("\\", "/").split("/")
    return "/".join(parts[-2:]) if len(parts) > 1 else filename


def plain(value: Any) -> Any:
    """Evidence as JSON-ready data: ``dataclasses.asdict`` without its deep copies (ten times
    faster on thousands of ranks; the values are shared, not copied)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {k: plain(v) for k, v in vars(value).items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def _threads(data: list[dict[str, Any]]) -> list[ThreadStack]:
    """ThreadStacks from their ``asdict`` form."""
    return [
        ThreadStack(
            t.get("name"),
            [Frame(**f) for f in t["frames"]],
            t.get("active"),
            t.get("owns_gil"),
            t.get("thread_id"),
        )
        for t in data
    ]
