"""The doctor's plain records: one ``Check`` per finding, one ``NodeReport`` per node, and the
``NodeSpec`` that tells a node what to check (JSON, so ``srun`` can hand it to every node)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from areal_watchdog.common.json_dataclass import PlainRecord

PASS, WARN, FAIL = "pass", "warn", "fail"
STATUSES = (PASS, WARN, FAIL)


@dataclass(frozen=True)
class Check:
    """One line of the table: what was checked, how it went, what was seen, how to fix it."""

    name: str
    status: str
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Check:
        status = str(data.get("status"))
        return cls(
            str(data.get("name", "?")),
            status if status in STATUSES else FAIL,
            str(data.get("detail", "")),
            str(data.get("fix", "")),
        )


def failed(checks: list[Check]) -> bool:
    return any(c.status == FAIL for c in checks)


@dataclass(frozen=True)
class NodeSpec(PlainRecord):
    """What every node checks, taken from the config (or this machine's defaults)."""

    python: str
    probe_dir: str  # where the filesystem checks make their temporary folder
    gpu_backend: str = "auto"
    gpu_recording: str | None = None
    gpus_needed: int = 0  # cluster.n_gpus_per_node
    debug_env: dict[str, str] = field(default_factory=dict)  # rendered Flight Recorder variables
    flight_recorder: bool = True
    areal_needed: bool = False  # the config is an AReaL experiment
    notify: list[dict[str, Any]] = field(default_factory=list)  # SinkSpec dicts: no secrets
    shared_dir: str | None = None  # Slurm: a folder the launcher made, that every node must see


@dataclass(frozen=True)
class NodeReport:
    """One node's checks, and its clock when it started them (for the skew between nodes)."""

    node: str
    started: float
    checks: list[Check]

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "started": self.started,
            "checks": [c.to_dict() for c in self.checks],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeReport:
        checks = [Check.from_dict(c) for c in data.get("checks", []) if isinstance(c, dict)]
        return cls(str(data.get("node", "?")), float(data.get("started", 0.0)), checks)
