"""Find the groups of a step that hang, by replaying halves, within a budget of replays.

Pure: ``hangs`` runs one replay (the launcher's ``replay_decides``) and says whether it hung the
same way (None: the replay failed, which proves nothing); ``trained_hangs`` replays one group
of the step before, which trained, as this step. This module only chooses what to replay next:

- a set known to hang is halved; when its first half hangs, the search goes on in it and the
  second half is kept to probe for another hanging row; when it does not, the second half is
  taken to hang (confirmed by a replay at the end, when the budget allows: a hang that needs
  rows of both halves falls back to the set that hung);
- the halves kept are probed, the largest first, and each that hangs is searched the same way;
- when every replay down to one group hung, one group of the step before is replayed as this
  step: when that hangs too, the hang follows the step (or the code), not the data, and no
  group is found.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

Hangs = Callable[[tuple[int, ...]], "bool | None"]


@dataclass(frozen=True)
class Trial:
    """One replay: the groups it fed and whether it hung the same way."""

    groups: tuple[int, ...]
    hung: bool | None  # None: the replay failed
    trained: bool = False  # groups of the step before (which trained), fed as this step


@dataclass(frozen=True)
class Bisection:
    """The groups found to hang, every replay that found them, and how the search ended:
    the budget ran out (``unchecked``: halves never probed for another hanging row), a replay
    failed, or the hang follows the step (``step_keyed``: nothing found)."""

    groups: tuple[int, ...]
    trials: tuple[Trial, ...]
    budget_spent: bool = False
    failed: bool = False
    step_keyed: bool = False
    unconfirmed: tuple[int, ...] = ()  # found by elimination, never replayed alone
    unchecked: tuple[int, ...] = ()


class _Stop(Exception):
    """The search ends here: the budget is spent, or a replay failed."""


@dataclass
class _Chain:
    """One search down from a set that hung: the smallest set replayed that hung, and the
    smaller one taken to hang because its sibling did not (None once replayed)."""

    hung: tuple[int, ...]
    inferred: tuple[int, ...] | None = None

    @property
    def found(self) -> tuple[int, ...]:
        return self.inferred if self.inferred is not None else self.hung


@dataclass
class _Search:
    hangs: Hangs
    budget: int
    floor: int
    trials: list[Trial] = field(default_factory=list)
    chains: list[_Chain] = field(default_factory=list)
    probes: list[tuple[int, ...]] = field(default_factory=list)

    def replay(self, groups: tuple[int, ...], trained_hangs: Callable[[], bool | None] | None = None
               ) -> bool:  # fmt: skip
        if len(self.trials) == self.budget:
            raise _Stop("budget")
        hung = trained_hangs() if trained_hangs else self.hangs(groups)
        self.trials.append(Trial(groups, hung, trained=trained_hangs is not None))
        if hung is None:
            raise _Stop("failed")
        return hung

    def search(self, start: tuple[int, ...]) -> None:
        """Halve ``start`` (replayed, it hung) down to ``floor`` groups."""
        chain = _Chain(start)
        self.chains.append(chain)
        current = start
        while len(current) >= 2 * self.floor:
            middle = len(current) // 2
            first, second = current[:middle], current[middle:]
            if self.replay(first):
                self.probes.append(second)
                chain.hung, chain.inferred, current = first, None, first
            else:
                chain.inferred = current = second

    def probe(self) -> None:
        """The halves kept, largest first: each that hangs holds another hanging row."""
        while self.probes:
            largest = max(self.probes, key=len)
            self.probes.remove(largest)
            if self.replay(largest):
                self.search(largest)

    def confirm(self) -> None:
        """Replay each set taken to hang by elimination; one that does not hang alone needs
        rows of its sibling too: its chain falls back to the set that hung."""
        for chain in self.chains:
            if chain.inferred is not None:
                if self.replay(chain.inferred):
                    chain.hung = chain.inferred
                chain.inferred = None


def bisect(
    groups: tuple[int, ...],
    hangs: Hangs,
    budget: int,
    floor: int = 1,
    trained_hangs: Callable[[], bool | None] | None = None,
) -> Bisection:
    """Narrow ``groups`` (known to hang together) to the groups that hang, in at most
    ``budget`` replays of at least ``floor`` groups each (module docstring)."""
    search = _Search(hangs, budget, floor)
    stopped = ""
    try:
        search.search(groups)
        every = bool(search.trials) and all(t.hung for t in search.trials)
        if trained_hangs and every and search.replay((0,), trained_hangs):
            return Bisection((), tuple(search.trials), step_keyed=True)
        search.probe()
        search.confirm()
    except _Stop as stop:
        stopped = str(stop)
    found = sorted({g for chain in search.chains for g in chain.found})
    unconfirmed = sorted({g for c in search.chains if c.inferred is not None for g in c.inferred})
    return Bisection(
        tuple(found),
        tuple(search.trials),
        budget_spent=stopped == "budget",
        failed=stopped == "failed",
        unconfirmed=tuple(unconfirmed),
        unchecked=tuple(sorted({g for p in search.probes for g in p})),
    )
