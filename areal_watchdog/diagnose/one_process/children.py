"""What a blocked culprit rank waits on in its children: the child it waits for (its main
thread in wait4/waitid), named in the verdict's summary with its command line and its own
kernel wait. Pure: plain evidence in, a sentence out."""

from __future__ import annotations

from typing import Any

from areal_watchdog.diagnose.verdict import Verdict
from areal_watchdog.evidence.kernel_readings.kernel_wait import WAIT_CALLS, KernelWait
from areal_watchdog.evidence.model import BLOCKED, Evidence, RankEvidence


def children_note(verdict: Verdict, evidence: Evidence) -> str:
    """What the blocked culprit ranks that wait for a child (wait4, waitid) wait on: ``Rank 1
    waits on its child pid 7 (`sh -c read answer`): S (sleeping) in read() on pipe:[5]``."""
    notes = []
    for rank in evidence.ranks:
        if rank.rank not in verdict.culprit_ranks or rank.state != BLOCKED or not rank.children:
            continue
        main = KernelWait.from_dict(rank.kernel_waits[0]) if rank.kernel_waits else None
        if main is None or main.syscall not in WAIT_CALLS:
            continue  # blocked elsewhere: its children (a DataLoader worker) are not the story
        child = waited_child(rank)
        wait: Any = child.get("kernel_wait")
        how = f": {KernelWait.from_dict(wait).phrase()}" if isinstance(wait, dict) else ""
        notes.append(
            f"Rank {rank.rank} waits on its child pid {child.get('pid')} "
            f"(`{str(child.get('command'))[:120]}`){how}."
        )
    return " ".join(notes)


def waited_child(process: RankEvidence) -> dict[str, Any]:
    """The child the process waits for (its main thread in wait4/waitid on that pid), else
    its newest direct child (a command it just ran), else its first descendant."""
    main = KernelWait.from_dict(process.kernel_waits[0]) if process.kernel_waits else None
    by_pid = {c.get("pid"): c for c in process.children}
    if main is not None and main.waits_for in by_pid:
        return by_pid[main.waits_for]
    direct = [c for c in process.children if c.get("parent_pid") == process.pid]
    return max(direct, key=lambda c: int(c.get("pid") or 0)) if direct else process.children[0]
