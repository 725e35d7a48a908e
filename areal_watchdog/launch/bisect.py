"""Find the smallest set of a step's groups that still hangs, by replaying halves.

Pure: ``hangs`` runs one replay (the launcher's ``replay_decides``) and says whether it hung the
same way (None: the replay failed, which proves nothing); this module only chooses what to
replay next, within a budget of replays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Trial:
    """One bisection replay: the groups it fed and whether it hung the same way."""

    groups: tuple[int, ...]
    hung: bool | None  # None: the replay failed


@dataclass(frozen=True)
class Bisection:
    """The smallest hanging set found, every replay that found it, and why it stopped
    shrinking before one group: the budget ran out, or a replay failed."""

    groups: tuple[int, ...]
    trials: tuple[Trial, ...]
    budget_spent: bool = False
    failed: bool = False


def bisect(
    groups: tuple[int, ...],
    hangs: Callable[[tuple[int, ...]], bool | None],
    budget: int,
    floor: int = 1,
) -> Bisection:
    """Halve ``groups`` (known to hang together) while one half hangs alone, down to ``floor``
    groups or ``budget`` replays. When neither half hangs alone the hang needs rows of both,
    and when a replay fails nothing is known of its half: the set stops there."""
    current, trials = groups, []
    while len(current) >= 2 * floor:
        middle = len(current) // 2
        for half in (current[:middle], current[middle:]):
            if len(trials) == budget:
                return Bisection(current, tuple(trials), budget_spent=True)
            trials.append(Trial(half, hangs(half)))
            if trials[-1].hung is None:
                return Bisection(current, tuple(trials), failed=True)
            if trials[-1].hung:
                current = half
                break
        else:
            break
    return Bisection(current, tuple(trials))
