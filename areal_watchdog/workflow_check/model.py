"""What the probe hands the launcher: one ``StageResult`` per stage run and one ``CheckResult``
for the whole check, as JSON in a file the launcher chose."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Self

from areal_watchdog.common.json_dataclass import PlainRecord


@dataclass(frozen=True)
class StageResult(PlainRecord):
    """One stage: its episodes' outcomes and latencies, and those pending at its time limit
    with their await chains (``chain``: outermost first, as a hang report shows them)."""

    name: str
    detail: str
    planned: int
    done: int = 0
    failed: int = 0
    rejected: int = 0
    pending: int = 0
    not_started: int = 0
    latencies: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    limit_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    pending_episodes: list[dict[str, Any]] = field(default_factory=list)
    blocked_loop: list[dict[str, Any]] = field(default_factory=list)  # a loop stuck in sync code
    blocked_by: str = ""  # the episode whose synchronous code holds the loop, when one does

    @property
    def passed(self) -> bool:
        return self.failed == self.pending == self.not_started == 0

    def percentile(self, share: float) -> float | None:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))]

    @property
    def per_second(self) -> float:
        return (self.done + self.rejected) / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class CheckResult(PlainRecord):
    """The workflow and reward the script named, the rewards the workflow called, the server
    and engine used, the staleness numbers, the stages run (the first that did not pass ends
    the check), or why none ran."""

    workflow: str = ""
    reward: str = ""  # workflow_kwargs' reward_fn, as the script named it
    reward_called: list[str] = field(default_factory=list)  # through AsyncRewardWrapper
    engine: str = ""
    staleness: dict[str, Any] | None = None
    stages: list[StageResult] = field(default_factory=list)
    error: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        stages = [StageResult.from_dict(s) for s in data.get("stages", [])]
        return cls(**{**data, "stages": stages})

    @property
    def passed(self) -> bool:
        return self.error is None and all(s.passed for s in self.stages)
