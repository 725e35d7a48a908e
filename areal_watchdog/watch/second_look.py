"""The second look before an action that ends a job: did anything move since the first?

A slow phase that would have recovered (every episode waiting a tool 1.5x the stall threshold, a
checkpoint written to a slow filesystem) looks like a hang at the first look. Before
``on_hang: cancel`` ends the job, the leader looks again a few seconds later and compares:

- a new step (the progress clock moved);
- a process whose working thread is in another function (function names only: a rank that
  spins in one loop is sampled at different lines of it, and has not moved), above the
  outermost wait it is in: a process polling in a wait (AReaL's Ray launcher in
  ``RayLauncher.wait``, asleep or in ``ray.get`` by turns; a trainer in ``prepare_batch``) is
  sampled at different calls below it, and has not moved until it leaves that wait;
- a process whose pending asyncio tasks changed (episodes finished, others started).

CPU time alone is no movement: a rank spinning forever burns it too. Nor is a moving stack
when both looks name a retry loop (episodes rejected and resubmitted, ``workflow_failing``):
there only a new step counts. Pure: compares plain data taken from two ``Evidence`` objects.
"""

from __future__ import annotations

from dataclasses import dataclass

from areal_watchdog.diagnose.activity import ROLLOUT_CALLS, work_thread
from areal_watchdog.diagnose.frames import bare
from areal_watchdog.evidence.model import BLOCKED, RUNNING, Evidence, RankEvidence

# Causes whose processes keep moving while nothing progresses.
RETRY_LOOPS = frozenset({"workflow_failing"})
# Calls that wait by polling: what is below them changes between samples, they do not.
WAITS = ROLLOUT_CALLS | {"wait"}


@dataclass(frozen=True)
class Marks:
    """What is compared between the two looks: per process (by pid), its working thread's
    functions and its pending tasks."""

    step: int | None
    functions: dict[int, tuple[str, ...]]
    tasks: dict[int, frozenset[str]]


def marks(evidence: Evidence, step: int | None) -> Marks:
    """The marks of one look at the job."""
    live = [p for p in evidence.processes() if p.state in (BLOCKED, RUNNING) and p.pid]
    return Marks(
        step,
        {p.pid: _functions(p) for p in live if p.pid},
        {p.pid: frozenset(str(t.get("name")) for t in p.tasks) for p in live if p.pid},
    )


def moved(first: Marks, second: Marks, *, steps_only: bool = False) -> list[str]:
    """What moved between the looks, for people; empty when nothing did. ``steps_only``: a
    retry loop, where only a new step is movement."""
    found = []
    if second.step is not None and second.step != first.step:
        found.append(f"a new step ({second.step})")
    if steps_only:
        return found
    changed = sorted(
        pid
        for pid, functions in second.functions.items()
        if pid in first.functions and functions != first.functions[pid]
    )
    if changed:
        found.append(f"the stacks of pid {', '.join(map(str, changed[:5]))} changed")
    done = sorted(pid for pid, tasks in second.tasks.items() if first.tasks.get(pid, tasks) - tasks)
    if done:
        found.append(f"pending tasks of pid {', '.join(map(str, done[:5]))} completed")
    return found


def _functions(process: RankEvidence) -> tuple[str, ...]:
    """The working thread's functions, outermost wait and out (frames are innermost first)."""
    thread = work_thread(process)
    names = [f.name for f in thread.frames] if thread else []
    waits = [i for i, name in enumerate(names) if bare(name) in WAITS]
    return tuple(names[waits[-1] :] if waits else names)
