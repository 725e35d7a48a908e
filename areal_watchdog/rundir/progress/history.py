"""The short history a hang's timeline is drawn from: when each step was seen, what this
node's GPUs did and how many of the job's GPUs worked, a bounded ring per series (its memory
does not grow with the job: ``python -m benchmarks.run --only scale``). The leading sidecar
keeps it (``watch/sidecar.py``) and writes it beside each incident (``history.json``); the picture
(``report/picture.py``) reads it there, in a process of its own, so drawing never delays a
report."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

STEPS_KEPT = 512  # step ends: at sub-second steps, minutes of them; at 10 s steps, hours
GPU_SAMPLES_KEPT = 900  # one a poll: 15 minutes at the shipped 1 s poll interval
NODE_LANES = 32  # nodes drawn a lane each (the first by name); the job's sum covers them all
NODE_SAMPLES_KEPT = 300  # a node's lane: 5 minutes at the shipped poll interval

# one GPU at one poll: (index, utilisation %, power W or None, power limit W or None)
GpuPoint = tuple[int, float, float | None, float | None]


@dataclass
class History:
    """Step ends and GPU samples, newest last; memory bounded by the rings' lengths."""

    node: str = ""
    steps: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=STEPS_KEPT))
    gpus: deque[tuple[float, tuple[GpuPoint, ...]]] = field(
        default_factory=lambda: deque(maxlen=GPU_SAMPLES_KEPT)
    )
    # every node's GPUs at work, as their statuses say: (time, working, of how many)
    job_gpus: deque[tuple[float, int, int]] = field(
        default_factory=lambda: deque(maxlen=GPU_SAMPLES_KEPT)
    )
    # each of the first NODE_LANES nodes: (time, mean utilisation %, total power W)
    nodes: dict[str, deque[tuple[float, float, float]]] = field(default_factory=dict)

    def note_step(self, step: int | None, at: float) -> None:
        """A step the clock saw (once each, at the time it was seen)."""
        if step is not None and (not self.steps or self.steps[-1][1] != step):
            self.steps.append((at, step))

    def note_gpus(self, at: float, samples: Sequence[Any]) -> None:
        """This node's GPUs at one poll (``GpuSample``s, or anything with their fields)."""
        if samples:
            points = tuple((s.index, s.utilization, s.power_w, s.power_limit_w) for s in samples)
            self.gpus.append((at, points))

    def note_job_gpus(self, at: float, statuses: Iterable[dict[str, Any]]) -> None:
        """The job's GPUs at work across its nodes (a sum: one number a poll at any size), and
        the first ``NODE_LANES`` nodes' use, a lane each."""
        working = total = 0
        for status in statuses:
            pace = status.get("pace") if isinstance(status.get("pace"), dict) else {}
            working += _count(pace.get("gpus_working"))
            total += _count(pace.get("gpus"))
            self._note_node(at, status)
        if total:
            self.job_gpus.append((at, working, total))

    def _note_node(self, at: float, status: dict[str, Any]) -> None:
        use, node = status.get("gpu_use"), status.get("node")
        if not isinstance(use, dict) or not isinstance(node, str):
            return
        utilization, power = use.get("utilization"), use.get("power_w")
        if not (_number(utilization) and _number(power)):
            return
        if node not in self.nodes:
            if len(self.nodes) >= NODE_LANES:
                return
            self.nodes[node] = deque(maxlen=NODE_SAMPLES_KEPT)
        self.nodes[node].append((at, float(utilization), float(power)))  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "steps": [{"t": t, "step": s} for t, s in self.steps],
            "gpus": [
                {"t": t, "index": i, "utilization": u, "power_w": p, "power_limit_w": limit}
                for t, points in self.gpus
                for i, u, p, limit in points
            ],
            "job_gpus": [{"t": t, "working": w, "of": n} for t, w, n in self.job_gpus],
            "nodes": {
                node: [{"t": t, "utilization": u, "power_w": p} for t, u, p in samples]
                for node, samples in self.nodes.items()
            },
        }

    @classmethod
    def from_dict(cls, data: object) -> History:
        """The record as written; anything damaged is left out, never a traceback."""
        history = cls()
        if not isinstance(data, dict):
            return history
        history.node = str(data.get("node") or "")
        for entry in _dicts(data.get("steps")):
            if _number(entry.get("t")) and isinstance(entry.get("step"), int):
                history.note_step(entry["step"], float(entry["t"]))
        by_time: dict[float, list[GpuPoint]] = {}
        for entry in _dicts(data.get("gpus")):
            index, utilization = entry.get("index"), entry.get("utilization")
            if _number(entry.get("t")) and isinstance(index, int) and _number(utilization):
                power, limit = _maybe(entry.get("power_w")), _maybe(entry.get("power_limit_w"))
                point = (index, float(utilization), power, limit)  # type: ignore[arg-type]
                by_time.setdefault(float(entry["t"]), []).append(point)
        for t in sorted(by_time):
            history.gpus.append((t, tuple(by_time[t])))
        for entry in _dicts(data.get("job_gpus")):
            if _number(entry.get("t")) and _count(entry.get("of")):
                history.job_gpus.append((float(entry["t"]), _count(entry.get("working")),
                                         _count(entry["of"])))  # fmt: skip
        nodes = data.get("nodes") if isinstance(data.get("nodes"), dict) else {}
        for node, samples in nodes.items():
            for entry in _dicts(samples):
                if _number(entry.get("t")):
                    history._note_node(float(entry["t"]), {"node": str(node), "gpu_use": entry})
        return history


def _dicts(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _maybe(value: object) -> float | None:
    return float(value) if _number(value) else None  # type: ignore[arg-type]
