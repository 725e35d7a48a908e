"""Storage that stopped answering: judged from what the kernel said of each process at the
look (``evidence.kernel_readings.kernel_wait``) and how long the sidecar's polls saw it blocked
there with no data moving (``kernel_blocked_s`` in its counters).

A rank in ``read()``, ``write()``, ``open()`` or ``stat()`` on a file of a mount, blocked there
(state ``D``; or asleep, as a FUSE reader waits in ``request_wait_answer``) at every poll for
``BLOCKED_IN_KERNEL_S`` with no byte moving, waits on a server that does not answer (a dead
NFS, Lustre or FUSE server): proof once it has not answered for a minute (``kinds``'s
``settle_s``: a server failing over answers again), naming the mount, its filesystem and the
file. A rank only passing through (a page-cache miss, an fsync that completes) is never there
that long with nothing moving. Pure: plain evidence in, a verdict out.
"""

from __future__ import annotations

from areal_watchdog.common.rankset import ranks_phrase
from areal_watchdog.diagnose.phrases import cap, is_are
from areal_watchdog.diagnose.verdict import Verdict
from areal_watchdog.evidence.kernel_readings.kernel_wait import KernelWait
from areal_watchdog.evidence.model import BLOCKED, RUNNING, Evidence, RankEvidence

BLOCKED_IN_KERNEL_S = 8.0  # in D with no data moving this long: the storage does not answer
CANCEL_NOTE = (
    "A cancel may not end them: a wait the storage server has taken (FUSE), or one that is "
    "not killable, ends at no signal, SIGKILL included, until the storage answers; the ranks "
    "then die at once (the launcher names those still blocked). Check the storage server and "
    "the mount (`mount | grep {mount}`) before restarting."
)


def storage_wait(process: RankEvidence) -> KernelWait | None:
    """The process's wait on storage, if the sidecar saw it blocked in the kernel with no data
    moving for ``BLOCKED_IN_KERNEL_S`` and it waits in a filesystem call on a mount now."""
    if process.movement is None or process.movement.kernel_blocked_s < BLOCKED_IN_KERNEL_S:
        return None
    for entry in process.kernel_waits:
        wait = KernelWait.from_dict(entry)
        if wait.stuck and wait.on_storage:
            return wait
    return None


def storage_stall(evidence: Evidence) -> Verdict | None:
    """Ranks blocked on one mount that stopped answering; the others wait on them."""
    stuck: dict[tuple[str, str], list[tuple[int, KernelWait]]] = {}
    for rank in evidence.ranks:
        if rank.state in (BLOCKED, RUNNING) and (wait := storage_wait(rank)) is not None:
            stuck.setdefault((wait.mount, wait.fstype), []).append((rank.rank or 0, wait))
    if not stuck:
        return None
    ranks_waits = max(stuck.values(), key=len)
    culprits = sorted(r for r, _ in ranks_waits)
    wait = ranks_waits[0][1]
    alive = [r.rank for r in evidence.ranks if r.state in (BLOCKED, RUNNING)]
    others = [r for r in alive if r not in culprits]
    behind = f"; {ranks_phrase(others)} wait on them" if others else ""
    source = f" from {wait.source}" if wait.source and wait.source != wait.fstype else ""
    files = sorted({w.path for _, w in ranks_waits})
    others = len(files) - 1
    more = f" (and {others} other file{'s' if others > 1 else ''})" if others else ""
    return Verdict(
        "storage_stall",
        0.9,
        culprits,
        f"{cap(ranks_phrase(culprits))} {is_are(culprits)} blocked in the kernel on storage "
        f"that stopped answering: {wait.syscall}() on {wait.path}{more}, a {wait.fstype} "
        f"filesystem mounted at {wait.mount}{source}, state {wait.state} with no data moving"
        f"{behind}. " + CANCEL_NOTE.format(mount=wait.mount),
    )
