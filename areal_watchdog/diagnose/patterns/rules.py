"""The hang patterns, one rule each, tried in order on the ranks sorted by what they do
(``Scene``): the first that recognises the scene names the category
(docs/hang-categories.md). Pure: no file is read, no process touched. The rules are read in
their order, and this one file shows which one wins (who failed first: ``crash``).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from areal_watchdog.common.rankset import ranks_phrase
from areal_watchdog.diagnose.one_process.activity import describe
from areal_watchdog.diagnose.patterns.crash import crash_verdict, error_line
from areal_watchdog.diagnose.patterns.storage import storage_stall
from areal_watchdog.diagnose.phrases import all_ranks, cap, is_are, their, verb
from areal_watchdog.diagnose.rollout_rules.rollout_evidence import addresses, server_entry
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

_SERVER_CALL = re.compile(
    r"pause_generation|continue_generation|update_weights_from|/generate|connection refused|"
    r"ClientConnectorError|Cannot connect to host",
    re.I,
)


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
    return _unknown(scene)


def _unknown(scene: Scene) -> Verdict:
    """No rule knows the scene. Where every rank runs the job's own code (none in a collective),
    it says where: a long phase of the job's own and a loop that never ends look alike there,
    and only the time without a step tells them apart."""
    running = scene.kind("running")
    if running and len(running) == len(scene.alive) == len(scene.evidence.ranks):
        return Verdict(
            "unknown",
            0.2,
            [],
            f"{cap(ranks_phrase(running))} {is_are(running)} in the job's own code "
            f"({_first_where(running, scene.acts)}), none in a collective: a long phase of its "
            "own (an evaluation, a computation) or a loop that never ends; the stacks cannot "
            "tell them apart, the time without a step decides.",
        )
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
    dead = [s for s in _dead_servers(scene.evidence) if _engine_call(controller, s)]
    servers = f" The inference server {addresses(dead)} refuses connections (dead?)." * bool(dead)
    return Verdict(
        "rank_crashed",
        0.9,
        [],
        f"The controller failed: {describe(controller).where}"
        f"{error_line(controller, 400)}{after}.{servers}",
        culprit_workers=[culprit_entry(controller), *map(server_entry, dead)],
    )


def _dead_servers(evidence: Evidence) -> list[dict]:
    return [s for s in evidence.servers if s.get("state") == "unreachable"]


def _engine_call(controller: RankEvidence, server: dict) -> bool:
    """The controller's error came from a call to the inference servers (its address, one of
    their endpoints, a refused connection), not from a bug a teardown then stopped them for."""
    info = controller.exit
    text = f"{info.message or ''} {info.traceback or ''}" if info else ""
    return str(server.get("address")) in text or bool(_SERVER_CALL.search(text))


def _failed(process: RankEvidence) -> bool:
    info = process.exit
    return process.state == EXITED and info is not None and bool(info.exc_type or info.code)


def _crashed(scene: Scene) -> Verdict | None:
    exited = any(r.state == EXITED for r in scene.evidence.ranks)
    if not (exited or scene.evidence.job_failed):
        return None
    return crash_verdict(scene.evidence, scene.acts)


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
def _storage_stall(scene: Scene) -> Verdict | None:
    return storage_stall(scene.evidence)


RULES = (
    _node_lost,
    _controller_failed,
    _crashed,
    _init_deadlock,
    _never_registered,
    _no_stack,
    _storage_stall,
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


def _first_where(rank_ids: list[int], acts: dict[int, Activity]) -> str:
    return acts[rank_ids[0]].where if rank_ids and rank_ids[0] in acts else "not seen"
