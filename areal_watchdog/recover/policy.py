"""Whether to start a hung job again (``on_hang: resume``), decided from its reports alone.

A hang that comes back at the same step, in the same category at the same call sites, after a
resume follows the job (its data or its code), not the machine: starting it again would loop.
Anything else is given the benefit of the doubt, a bounded number of times, with a growing
pause in between. Pure: the launcher reads the reports and acts on the decision.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from areal_watchdog.common.rankset import culprits_phrase


@dataclass(frozen=True)
class Hang:
    """What tells two hangs of one run apart: where it stopped, what and who."""

    incident_id: str | None
    category: str
    step: int | None  # the last step done before it
    culprits: str  # "culprit ranks 2", "culprit workers rollout 0 (pid 12)", ...
    sites: tuple[str, ...]  # where the culprits wait, sorted

    @classmethod
    def from_report(
        cls, report: dict[str, Any] | None, incident_id: str | None, resumed_after: int | None
    ) -> Hang:
        """The hang a report describes (``resumed_after``: the step the job was resumed after,
        the last one done when it hangs before its first new step); a report the disk never
        took is an unknown hang."""
        if not isinstance(report, dict):
            return cls(incident_id, "unknown", resumed_after, "-", ())
        culprit_ranks = [r for r in report.get("culprit_ranks") or [] if isinstance(r, int)]
        workers = [w for w in report.get("culprit_workers") or [] if isinstance(w, dict)]
        culprits = [
            p for p in [*(report.get("ranks") or []), *workers]
            if isinstance(p, dict) and (p.get("rank") in culprit_ranks or "rank" not in p)
        ]  # fmt: skip
        step = report.get("last_step")
        return cls(
            incident_id=str(report.get("incident_id") or incident_id),
            category=str(report.get("category") or "unknown"),
            step=step if isinstance(step, int) else resumed_after,
            culprits=culprits_phrase(culprit_ranks, workers),
            sites=tuple(sorted({_site(p.get("where")) for p in culprits} - {""})),
        )

    def like(self, other: Hang) -> bool:
        """Hangs the same way: same category, the culprits in the same functions (not lines: a
        spinning loop is sampled on any of its lines; an unknown hang is like nothing: it cannot
        be told apart)."""
        if "unknown" in (self.category, other.category):
            return False
        return (self.category, _places(self.sites)) == (other.category, _places(other.sites))

    def within(self, original: Hang) -> bool:
        """A replay of some of the original's rows hangs the same way: the same category, a
        culprit waiting in one of the original's functions (two poisoned rows on two ranks
        name two sites; a replay holding one of them names one)."""
        if self.like(original):
            return True
        if "unknown" in (self.category, original.category) or self.category != original.category:
            return False
        return bool(_places(self.sites) & _places(original.sites))

    def same_as(self, other: Hang) -> bool:
        """The same hang again: hangs the same way, at the same step."""
        return self.like(other) and self.step == other.step

    def describe(self) -> str:
        site = self.sites[0] if self.sites else ""
        where = f" {site}" if site.startswith("at ") else f" at {site}" if site else ""
        step = f"step {self.step}" if self.step is not None else "before the first step"
        return f"{self.category} ({self.culprits}{where}), {step}"


def _places(sites: tuple[str, ...]) -> set[str]:
    """Call sites without their line numbers (``at f.py:9 in g()`` -> ``at f.py in g()``)."""
    return {_LINE.sub(" in ", site) for site in sites}


_LINE = re.compile(r":\d+ in ")


def _site(where: object) -> str:
    """The innermost frame of a report's ``where`` (``at f.py:9 in g() <- h() <- ...``)."""
    return str(where or "").split(" <- ")[0]


@dataclass(frozen=True)
class Decision:
    """Start the job again (after ``backoff_s``), or stop and say why."""

    resume: bool
    reason: str
    backoff_s: float = 0.0


def decide(
    hangs: list[Hang], max_attempts: int, backoff: float, replay_note: str | None = None,
    replay_stops: bool = False,
) -> Decision:  # fmt: skip
    """The decision after the newest of ``hangs`` (every hang of this run, oldest first);
    ``replay_note``: what replaying its step showed (``replay_decides``), None without a dump;
    ``replay_stops``: the replays showed that a resume would hang the same way again."""
    newest, resumes = hangs[-1], len(hangs) - 1
    if replay_stops and replay_note:
        return Decision(False, f"{newest.describe()}: {replay_note}")
    if resumes and newest.same_as(hangs[-2]):
        return Decision(
            False,
            f"the same hang came back after a resume: {newest.describe()}; it follows the job, "
            "not the machine, so resuming again would loop",
        )
    if resumes >= max_attempts:
        return Decision(
            False, f"{max_attempts} resume(s) spent (watchdog.resume.max_attempts): giving up"
        )
    why = replay_note or "no dumped step to replay, so it is taken as transient"
    return Decision(
        True,
        f"resume {resumes + 1} of {max_attempts} after {newest.describe()}: {why}; the job "
        "restarts from its last checkpoint",
        backoff * 2**resumes,
    )
