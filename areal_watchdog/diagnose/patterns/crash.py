"""Who failed first when ranks ended: the crash verdict's story (the first failure that is no
consequence of a lost peer, a rank that left early with code 0, or failures that all look
secondary), with the first line of its error. Pure: reads exit records only."""

from __future__ import annotations

import re

from areal_watchdog.common.rankset import ranks_phrase
from areal_watchdog.diagnose.phrases import cap
from areal_watchdog.diagnose.verdict import Activity, Verdict
from areal_watchdog.evidence.model import EXITED, Evidence, RankEvidence

_SECONDARY_FAILURE = re.compile(
    r"connection (closed|reset)|broken pipe|econnreset|connection refused|timed? ?out|"
    r"DistNetworkError|DistBackendError|SignalException|SIGTERM|recvBytes|sendBytes|"
    r"peer .*(closed|reset)",
    re.I,
)
_PEER_ADDRESS = re.compile(r"\[([0-9a-fA-F.:]+)\]:(\d+)")


def crash_verdict(evidence: Evidence, acts: dict[int, Activity]) -> Verdict:
    """The crash verdict: the ranks that failed first, named with their error."""
    exited = [r for r in evidence.ranks if r.state == EXITED]
    failed = [r for r in exited if r.exit is None or r.exit.code != 0 or r.exit.exc_type]
    primary = [r for r in failed if not _is_secondary(r)]
    quiet = [r for r in exited if r.exit is not None and r.exit.code == 0 and not r.exit.exc_type]
    others_failed_or_waiting = len(failed) > 0 or any(r.state != EXITED for r in evidence.ranks)
    peers = sorted(
        {
            f"{h}:{p}"
            for r in failed
            for h, p in _PEER_ADDRESS.findall((r.exit.message or "") if r.exit else "")
        }
    )
    peer_note = f" Peers report lost connections to {', '.join(peers[:3])}." if peers else ""

    if primary:
        primary.sort(key=lambda r: r.exit.time if r.exit and r.exit.time else float("inf"))
        first = primary[0]
        culprits = [r.rank for r in primary if _same_failure(r, first)]
        rest = [r.rank for r in failed if r.rank not in culprits]
        tail = f"; {ranks_phrase(rest)} failed after it" if rest else ""
        return Verdict(
            "rank_crashed",
            0.9,
            sorted(culprits),
            f"{cap(ranks_phrase(culprits))} failed first: {acts[first.rank].where}"
            f"{error_line(first)}{tail}.{peer_note}",
        )
    if quiet and others_failed_or_waiting:
        quiet_ranks = [r.rank for r in quiet]
        return Verdict(
            "rank_crashed",
            0.85,
            sorted(quiet_ranks),
            f"{cap(ranks_phrase(quiet_ranks))} exited with code 0 while "
            f"{'the other ranks failed' if failed else 'the other ranks were still running'}: "
            f"a rank that leaves early strands its peers.{peer_note}",
        )
    if failed:
        failed.sort(key=lambda r: r.exit.time if r.exit and r.exit.time else float("inf"))
        first = failed[0]
        return Verdict(
            "rank_crashed",
            0.5,
            [first.rank],
            f"{cap(ranks_phrase([first.rank]))} failed first ({acts[first.rank].where}"
            f"{error_line(first)}); every failure looks like a consequence of a lost peer."
            f"{peer_note}",
        )
    told = (
        f"{cap(ranks_phrase([r.rank for r in quiet]))} returned with code 0 and no rank failed"
        if quiet
        else "The job failed but no rank left an exit record"
    )
    return Verdict("rank_crashed", 0.3, [], f"{told}; see the log tails.")


def _is_secondary(rank: RankEvidence) -> bool:
    info = rank.exit
    if info is None:
        return True
    if info.code is not None and info.code in (-15, -2) and not info.exc_type:
        return True  # terminated by the launcher after another rank failed
    text = f"{info.exc_type or ''} {info.message or ''}"
    return bool(_SECONDARY_FAILURE.search(text))


def _same_failure(rank: RankEvidence, first: RankEvidence) -> bool:
    a, b = rank.exit, first.exit
    if a is None or b is None:
        return rank is first
    close = a.time is not None and b.time is not None and abs(a.time - b.time) < 1.0
    return rank is first or (close and a.exc_type == b.exc_type and a.code == b.code)


def error_line(rank: RankEvidence, limit: int = 160) -> str:
    """`` (first line of its error)``, or nothing."""
    info = rank.exit
    if info is None or not info.message:
        return ""
    message = info.message.strip().splitlines()[0][:limit] if info.message.strip() else ""
    return f" ({message})" if message else ""
