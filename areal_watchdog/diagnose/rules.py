"""The hang patterns, one rule each, tried in order on the ranks sorted by what they do
(``Scene``): the first that recognises the scene names the category
(docs/hang-categories.md). Pure: no file is read, no process touched. Past 400 lines on
purpose: the rules are read in their order, and one file shows which one wins.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from areal_watchdog.common.rankset import ranks_phrase
from areal_watchdog.diagnose.activity import describe
from areal_watchdog.diagnose.phrases import all_ranks, cap, is_are, their, verb
from areal_watchdog.diagnose.rollout_evidence import addresses, server_entry
from areal_watchdog.diagnose.verdict import Activity, Verdict, culprit_entry
from areal_watchdog.evidence.model import (
    BLOCKED,
    EXITED,
    MISSING,
    RUNNING,
    UNRESPONSIVE,
    Evidence,
    RankEvidence,
)

_SECONDARY_FAILURE = re.compile(
    r"connection (closed|reset)|broken pipe|econnreset|connection refused|timed? ?out|"
    r"DistNetworkError|DistBackendError|SignalException|SIGTERM|recvBytes|sendBytes|"
    r"peer .*(closed|reset)",
    re.I,
)
_PEER_ADDRESS = re.compile(r"\[([0-9a-fA-F.:]+)\]:(\d+)")


@dataclass
class Scene:
    """The ranks sorted by what they do: what every rule reads."""

    evidence: Evidence
    acts: dict[int, Activity]
    alive: list[RankEvidence]
    missing: list[int]
    unresponsive: list[int]
    by_kind: dict[str, list[int]]

    @classmethod
    def of(cls, evidence: Evidence, acts: dict[int, Activity]) -> Scene:
        alive = [r for r in evidence.ranks if r.state in (BLOCKED, RUNNING)]
        by_kind: dict[str, list[int]] = {}
        for r in alive:
            by_kind.setdefault(acts[r.rank].kind, []).append(r.rank)
        return cls(
            evidence,
            acts,
            alive,
            [r.rank for r in evidence.ranks if r.state == MISSING],
            [r.rank for r in evidence.ranks if r.state == UNRESPONSIVE],
            by_kind,
        )

    def kind(self, *kinds: str) -> list[int]:
        return [r for k in kinds for r in self.by_kind.get(k, [])]


def decide(evidence: Evidence, acts: dict[int, Activity]) -> Verdict:
    """The first rule that recognises the scene names the category (docs/hang-categories.md)."""
    scene = Scene.of(evidence, acts)
    for rule in RULES:
        verdict = rule(scene)
        if verdict is not None:
            return verdict
    return Verdict(
        "unknown",
        0.2,
        sorted(scene.unresponsive),
        "The stacks fit no known hang pattern; read the stack groups below.",
    )


def _node_lost(scene: Scene) -> Verdict | None:
    lost = sorted(scene.evidence.lost_nodes)
    if not lost:
        return None
    culprits = sorted(r.rank for r in scene.evidence.ranks if r.node in lost)
    who = f" ({ranks_phrase(culprits)})" if culprits else ""
    return Verdict(
        "node_lost",
        0.9,
        culprits,
        f"Node{'s' if len(lost) > 1 else ''} {', '.join(lost)}{who} vanished: the watchdog "
        f"sidecar and the ranks there stopped answering (node failure, OOM kill or "
        f"preemption); the other ranks fail or wait because of it.",
    )


def _controller_failed(scene: Scene) -> Verdict | None:
    """AReaL's single controller raised (an ``EngineCallError`` carrying a worker's error, a
    bug in the script) and the workers were ended after it: the controller's exception is the
    story, not the ranks its teardown killed, and an inference server that refuses connections
    is named beside it (an engine call against a dead server). A rank that raised before it
    comes first."""
    controller = next(
        (w for w in scene.evidence.workers if w.role == "controller" and _failed(w)), None
    )
    if controller is None or controller.exit is None:
        return None
    when = controller.exit.time or float("inf")
    if any(_failed(r) and r.exit and r.exit.exc_type and (r.exit.time or 0) < when
           for r in scene.evidence.ranks):  # fmt: skip
        return None
    ended = [r.rank for r in scene.evidence.ranks if r.state == EXITED]
    after = f"; {ranks_phrase(ended)} ended after it" if ended else ""
    dead = [s for s in scene.evidence.servers if s.get("state") == "unreachable"]
    servers = f" The inference server {addresses(dead)} refuses connections (dead?)." * bool(dead)
    return Verdict(
        "rank_crashed",
        0.9,
        [],
        f"The controller failed: {describe(controller).where}"
        f"{_error_line(controller, 400)}{after}.{servers}",
        culprit_workers=[culprit_entry(controller), *map(server_entry, dead)],
    )


def _failed(process: RankEvidence) -> bool:
    info = process.exit
    return process.state == EXITED and info is not None and bool(info.exc_type or info.code)


def _crashed(scene: Scene) -> Verdict | None:
    exited = any(r.state == EXITED for r in scene.evidence.ranks)
    if not (exited or scene.evidence.job_failed):
        return None
    return _crash_verdict(scene.evidence, scene.acts)


def _init_deadlock(scene: Scene) -> Verdict | None:
    acts = scene.acts
    if scene.evidence.first_step_seen or not (scene.kind("init") or scene.missing):
        return None
    barrier = [
        r for r in scene.kind("collective") if acts[r].op in ("barrier", "monitored_barrier")
    ]
    in_init = scene.kind("init") + barrier
    if not in_init:
        return None
    others = [r.rank for r in scene.alive if r.rank not in in_init]
    others += scene.missing + scene.unresponsive
    late = (
        f"{ranks_phrase(others)} never arrived ({_first_where(others, acts)})"
        if others
        else "no rank can be named as late"
    )
    return Verdict(
        "init_deadlock",
        0.85 if others else 0.5,
        sorted(others),
        f"Before the first step, {ranks_phrase(in_init)} {verb(in_init, 'wait')} in "
        f"{acts[in_init[0]].op} for {their(in_init)} peers; {late}.",
    )


def _never_registered(scene: Scene) -> Verdict | None:
    if not scene.missing:
        return None
    missing = f"{ranks_phrase(scene.missing)} never registered with the watchdog"
    summary = f"{missing}."
    if len(scene.missing) == len(scene.evidence.ranks):  # none did: the job never started them
        summary = (
            f"No rank started: {missing} within the start-up timeout (torchrun waiting at a "
            "rendezvous that a node never joined, or a launcher or container that never "
            "started them); see each node's log."
        )
    return Verdict("unknown", 0.3, sorted(scene.missing), summary)


def _no_stack(scene: Scene) -> Verdict | None:
    if scene.alive:
        return None
    return Verdict(
        "unknown",
        0.2,
        sorted(scene.unresponsive),
        "No stack could be taken from any rank; see the errors in the report.",
    )


def _cleanup_deadlock(scene: Scene) -> Verdict | None:
    cleanup, acts = scene.kind("cleanup"), scene.acts
    if not cleanup or len(cleanup) >= len(scene.alive):
        return None
    rest = [r.rank for r in scene.alive if r.rank not in cleanup]
    return Verdict(
        "cleanup_deadlock",
        0.85,
        sorted(cleanup),
        f"{cap(ranks_phrase(cleanup))} already left the training loop and {is_are(cleanup)} "
        f"in cleanup ({acts[cleanup[0]].where}) while {ranks_phrase(rest)} still "
        f"{verb(rest, 'wait')} in {acts[rest[0]].where}: the loop was left early (an early "
        f"break or an exception).",
    )


def _p2p_mismatch(scene: Scene) -> Verdict | None:
    p2p = scene.kind("p2p")
    if not p2p:
        return None
    culprits = (_minority(p2p, scene.acts) if len(p2p) * 2 > len(scene.alive) else p2p) or p2p
    return Verdict(
        "p2p_mismatch",
        0.75,
        sorted(culprits),
        f"{cap(ranks_phrase(culprits))} {verb(culprits, 'wait')} in point-to-point "
        f"{scene.acts[culprits[0]].where} with no matching peer operation.",
    )


def _dataloader_stall(scene: Scene) -> Verdict | None:
    loaders, collective = scene.kind("dataloader"), scene.kind("collective")
    if not (loaders and collective):
        return None
    return Verdict(
        "dataloader_stall",
        0.85,
        sorted(loaders),
        f"{cap(ranks_phrase(loaders))} {is_are(loaders)} blocked fetching data "
        f"({scene.acts[loaders[0]].where}) while {ranks_phrase(collective)} "
        f"{verb(collective, 'wait')} in {scene.acts[collective[0]].op}.",
    )


def _straggler(scene: Scene) -> Verdict | None:
    waiting = scene.kind("collective", "p2p")
    busy = scene.kind("running", "dataloader") + scene.unresponsive
    blocked = scene.kind("blocked")
    if not (waiting and (busy or blocked)):
        return None
    late = busy or blocked
    doing = "still in ordinary code" if busy else "blocked outside any collective, burning no CPU"
    return Verdict(
        "straggler",
        (0.8 if len(late) < len(waiting) else 0.55) if busy else 0.5,
        sorted(late),
        f"{cap(ranks_phrase(late))} {is_are(late)} {doing} "
        f"({_first_where(late, scene.acts)}) while {ranks_phrase(waiting)} "
        f"{verb(waiting, 'wait')} in {scene.acts[waiting[0]].op}: a straggler, not a code-path "
        f"difference.",
    )


def _frozen_peer(scene: Scene) -> Verdict | None:
    """A stopped rank (SIGSTOP, a debugger) while every other waits in a collective: wherever
    its stack stopped (ordinary code, another collective), it is the frozen peer."""
    frozen = sorted(r.rank for r in scene.alive if r.process_status == "stopped")
    waiting = [r for r in scene.kind("collective", "p2p") if r not in frozen]
    if not frozen or not waiting or len(frozen) + len(waiting) != len(scene.alive):
        return None
    return Verdict(
        "collective_stuck",
        0.8,
        frozen,
        f"{cap(ranks_phrase(frozen))} {is_are(frozen)} stopped (SIGSTOP or a debugger) while "
        f"{ranks_phrase(waiting)} {verb(waiting, 'wait')} in a collective "
        f"({scene.acts[waiting[0]].where}): a frozen peer.",
    )


def _collective_stuck(scene: Scene) -> Verdict | None:
    collective, acts = scene.kind("collective"), scene.acts
    if not collective or len(collective) != len(scene.alive):
        return None
    if len({acts[r].signature for r in collective}) != 1:
        return None
    where = acts[collective[0]].where
    return Verdict(
        "collective_stuck",
        0.7,
        [],
        f"{all_ranks(collective, 'wait')} in the same collective ({where}): the code paths "
        f"agree, so suspect the network, NCCL or a frozen peer.",
    )


def _collective_mismatch(scene: Scene) -> Verdict | None:
    collective, acts = scene.kind("collective"), scene.acts
    if not collective or len(collective) != len(scene.alive):
        return None
    culprits = _minority(collective, acts)
    dominant = [r for r in collective if r not in culprits]
    tie = len(culprits) * 2 >= len(collective)
    sites = len({acts[r].signature for r in collective})
    summary = (
        f"{cap(ranks_phrase(culprits))} {is_are(culprits)} blocked in {acts[culprits[0]].where} "
        f"while {ranks_phrase(dominant)} {verb(dominant, 'wait')} in {acts[dominant[0]].where}: "
        f"the ranks took different code paths."
        if dominant
        else f"The ranks wait in different collectives ({sites} call sites), a tie with no "
        f"majority: the ranks took different code paths, and the stacks cannot tell which "
        f"side broke the pattern."
    )
    confidence = 0.45 if tie else (0.9 if len(culprits) * 4 <= len(collective) else 0.75)
    return Verdict("collective_mismatch", confidence, sorted(culprits), summary)


# The categories, in the order they are tried: the first that fits wins.
RULES = (
    _node_lost,
    _controller_failed,
    _crashed,
    _init_deadlock,
    _never_registered,
    _no_stack,
    _cleanup_deadlock,
    _frozen_peer,
    _p2p_mismatch,
    _dataloader_stall,
    _straggler,
    _collective_stuck,
    _collective_mismatch,
)


def _minority(rank_ids: list[int], acts: dict[int, Activity]) -> list[int]:
    """Ranks outside the largest signature group (all ranks when the largest groups tie)."""
    counts = Counter(acts[r].signature for r in rank_ids)
    ordered = counts.most_common()
    top_size = ordered[0][1]
    tied = [sig for sig, n in ordered if n == top_size]
    if len(tied) > 1:
        return list(rank_ids)
    return [r for r in rank_ids if acts[r].signature != ordered[0][0]]


def _crash_verdict(evidence: Evidence, acts: dict[int, Activity]) -> Verdict:
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
            f"{_error_line(first)}{tail}.{peer_note}",
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
            f"{_error_line(first)}); every failure looks like a consequence of a lost peer."
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


def _error_line(rank: RankEvidence, limit: int = 160) -> str:
    info = rank.exit
    if info is None or not info.message:
        return ""
    message = info.message.strip().splitlines()[0][:limit] if info.message.strip() else ""
    return f" ({message})" if message else ""


def _first_where(rank_ids: list[int], acts: dict[int, Activity]) -> str:
    return acts[rank_ids[0]].where if rank_ids and rank_ids[0] in acts else "not seen"
