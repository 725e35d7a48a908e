"""How strong a look's verdict is, and what makes two verdicts the same finding: the rules the
escalation (``watch/silence/escalation.py``) applies to a verdict, pure, read from the table of hang
kinds (``kinds``)."""

from __future__ import annotations

from typing import Any

from areal_watchdog.diagnose.kinds import CATEGORIES, CAUSES, kind_of, names
from areal_watchdog.diagnose.verdict import Verdict

CONCLUSIVE_CATEGORIES = names(CATEGORIES, proof=True)
CONCLUSIVE_CAUSES = names(CAUSES, proof=True)
TIME_DECIDES = names(CAUSES, time_decides=True)  # causes no stack tells from a slow phase
# In the rank's own code: idle (burning no CPU) or running (a CPU evaluation, a long save).
SLOW_PHASE_KINDS = frozenset({"blocked", "running"})
DAMAGE = names(CAUSES, damage=True)  # causes whose completions are the damage, not movement


def strength(verdict: Verdict) -> str:
    """``conclusive`` (act now), ``provable`` (a second look decides) or ``time`` (only the
    hard limit does)."""
    kind = kind_of(verdict.category, verdict.cause)
    if kind.proof or proven_mismatch(verdict):
        return "conclusive"
    return "time" if kind.time_decides or kind.damage or slow_phase(verdict) else "provable"


def settles_in(verdict: Verdict, silent_s: float) -> float:
    """Seconds until a conclusive verdict is final, at ``silent_s`` seconds of silence (0: it
    is): storage that stops answering may be failing over, and answers again within a minute."""
    return max(0.0, kind_of(verdict.category, verdict.cause).settle_s - silent_s)


def slow_phase(verdict: Verdict) -> bool:
    """No rank waits on another: every rank is in its own code, idle (asleep, or waiting on its
    disk) or running (an evaluation on the CPU, a scoring loop), none in a collective, a
    receive or a rollout wait. Nothing proves a hang there (an unannounced checkpoint save, an
    evaluation every rank runs look the same), so time decides: the hard limit ends a livelock.
    A few ranks spinning while the others wait on them stay provable (``straggler``)."""
    kinds = {a.kind for a in verdict.activities.values()}
    return verdict.category == "unknown" and bool(kinds) and kinds <= SLOW_PHASE_KINDS


def proven_mismatch(verdict: Verdict) -> bool:
    """A collective mismatch the Flight Recorder shows: ranks issued different operations (or
    sizes) at one sequence number of one group, and it is no tie. No later collective of that
    group can complete, so no second look is needed."""
    if verdict.category != "collective_mismatch" or not verdict.collectives:
        return False
    return any(
        g.get("kind") == "mismatch" and g.get("culprit_ranks") and not g.get("tie")
        for g in verdict.collectives.get("groups") or []
    )


def verdict_key(verdict: Verdict) -> tuple[Any, ...]:
    """What makes two looks' verdicts the same finding (a repeat is not written again)."""
    workers = tuple(sorted(str(w.get("pid")) for w in verdict.culprit_workers))
    return verdict.category, verdict.cause, tuple(verdict.culprit_ranks), workers
