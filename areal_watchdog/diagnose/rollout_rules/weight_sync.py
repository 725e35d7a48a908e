"""``weight_sync_stuck``: a weight update (disk or distributed) that some inference servers
never complete. The updating processes' pending requests still await them, or the servers' own
request threads are still in an update handler (``_lost_update``); else a process is inside a
trainer-to-inference weight transfer (``update_weights_from_distributed``,
``init_weights_update_group``, ...) and blocked, while the inference side is not transferring
(AReaL #1439: the server never entered recv). Pure, as every rule is; tried before the rollout
rules (``rollout``)."""

from __future__ import annotations

import re
from typing import Any

from areal_watchdog.common.rankset import ranks_phrase
from areal_watchdog.diagnose.one_process.frames import display_path, is_areal
from areal_watchdog.diagnose.phrases import cap, is_are, noun, them, verb
from areal_watchdog.diagnose.rollout_rules.rollout_evidence import (
    EPISODE_ROOTS,
    SERVER,
    RolloutFinding,
    addresses,
    bare_name,
    first,
    links,
    names,
    server_entry,
)
from areal_watchdog.diagnose.verdict import culprit_entry
from areal_watchdog.evidence.model import (
    Evidence,
    Frame,
    RankEvidence,
)

_WEIGHT_SYNC = re.compile(
    r"update_weights?_from_distributed|init_weights?_update_group|update_weights?_from_tensor|"
    r"broadcast_weights|_update_bucket_weights|upload_weights",
    re.I,
)
# Any weight update, disk path included: AReaL's trainer, rollout-worker and controller sides
# (``_update_weights_from_disk``, the controller's ``update_weights_disk`` callback), the server
# handlers (SGLang's ``update_weights_from_disk``, AReaL's vLLM ``areal_update_weights[_xccl]``).
# AReaL's bare ``update_weights`` (``TrainController``, ``FSDPEngine``) counts in AReaL's files
# only (``_in_weight_update``). A disk update is a normal phase of each step (its trainer ranks
# meet at a barrier): it is a hang only when a server is known to hold it (``_lost_update``).
_WEIGHT_UPDATE = re.compile(
    rf"{_WEIGHT_SYNC.pattern}|update_weights?_from_disk|update_weights_disk$|"
    r"areal_update_weights?",
    re.I,
)


def weight_sync_finding(evidence: Evidence, live: list[RankEvidence]) -> RolloutFinding | None:
    """A finding when a weight update is held by a server or a transfer is stuck, else None."""
    updating = [(p, f) for p in live if p.role != SERVER and (f := first(p, in_weight_update))]
    lost = _lost_update(evidence, updating) if updating else None
    if lost is not None:
        return lost
    syncing = [(p, f) for p in live if (f := first(p, lambda f: _WEIGHT_SYNC.search(f.name)))]
    return _weight_sync(evidence, syncing) if syncing else None


def _weight_sync(evidence: Evidence, syncing: list[tuple[RankEvidence, Frame]]) -> RolloutFinding:
    who = [p for p, _ in syncing]
    frame = syncing[0][1]
    idle = [s for s in evidence.servers if s.get("state") == "up" and not s.get("running")]
    others = sorted(r.rank for r in evidence.ranks if r not in who and r.rank is not None)
    side = (
        f"the inference {noun(idle, 'server')} {addresses(idle)} {is_are(idle)} up and idle "
        "and never entered the receiving side of the transfer"
        if idle
        else "the inference side is not transferring"
    )
    rest = f"; {ranks_phrase(others)} {verb(others, 'wait')} for {them(who)}" if others else ""
    return RolloutFinding(
        "weight_sync_stuck",
        None,
        0.85 if idle else 0.7,
        sorted(p.rank for p in who if p.rank is not None),
        f"{cap(names(who))} {is_are(who)} blocked sending weights in {bare_name(frame)}() at "
        f"{display_path(frame.filename, who[0].cwd)}:{frame.line}, and {side}{rest}.",
        [server_entry(s) for s in idle],
    )


def in_weight_update(frame: Frame) -> bool:
    """A weight-transfer call; a user's own ``update_weights`` (a DDP job's) is none."""
    if _WEIGHT_UPDATE.search(frame.name):
        return True
    return bare_name(frame) == "update_weights" and is_areal(frame.filename)


def _lost_update(
    evidence: Evidence, updating: list[tuple[RankEvidence, Frame]]
) -> RolloutFinding | None:
    """A weight update that some inference servers never complete: the servers that the
    updating processes' pending requests still await (AReaL's ``_update_weights_from_disk`` and
    ``_from_distributed`` send one request per server and gather them) or whose own request
    thread is still in an update handler; the others completed it. None when no server is
    known to hold it."""
    awaited = _awaited_by_update(evidence, updating)
    handling = {
        p.address: f
        for p in evidence.workers
        if p.role == SERVER and p.address and (f := first(p, in_weight_update))
    }
    held = sorted(set(awaited) | set(handling))
    if not held:
        return None
    direct = list({p.pid: p for a in held for p, _ in awaited.get(a, [])}.values())
    others = [(p, f) for p, f in updating if p not in direct]
    servers = [server_entry(_probe_of(evidence, a)) for a in held]
    return RolloutFinding(
        "weight_sync_stuck",
        None,
        0.9 if set(awaited) & set(handling) else 0.85,
        [],
        _lost_update_summary(evidence, held, awaited, handling, others),
        servers + [culprit_entry(p) for p in direct],
    )


def _awaited_by_update(
    evidence: Evidence, updating: list[tuple[RankEvidence, Frame]]
) -> dict[str, list[tuple[RankEvidence, dict[str, Any]]]]:
    """Inference-server address -> (process, task) of each pending request an updating process
    still waits on there; episodes (generation) are not updates."""
    servers = {p.address for p in evidence.workers if p.role == SERVER and p.address}
    servers |= {s.get("address") for s in evidence.servers if s.get("engine")}
    awaited: dict[str, list[tuple[RankEvidence, dict[str, Any]]]] = {}
    for process, _ in updating:
        for task in process.tasks:
            address = task.get("awaiting")
            if address in servers and not links(task) & EPISODE_ROOTS:
                awaited.setdefault(address, []).append((process, task))
    return awaited


def _lost_update_summary(
    evidence: Evidence,
    held: list[str],
    awaited: dict[str, list[tuple[RankEvidence, dict[str, Any]]]],
    handling: dict[str, Frame],
    others: list[tuple[RankEvidence, Frame]],
) -> str:
    """Who waits where, and what the held servers' own threads show."""
    parts = [_held_on(evidence, a, awaited.get(a, []), handling.get(a)) for a in held]
    text = cap("; ".join(parts)) + "."
    if others:
        text += " " + cap("; ".join(f"{names([p])} waits in {_at(p, f)}" for p, f in others))
        text += "."
    done = [s["address"] for s in evidence.servers
            if s.get("engine") and s.get("address") not in held]  # fmt: skip
    if done:
        text += f" No update request is pending on {', '.join(done)}."
    return text


def _held_on(
    evidence: Evidence,
    address: str,
    requests: list[tuple[RankEvidence, dict[str, Any]]],
    handler: Frame | None,
) -> str:
    """One held server: who waits for its answer, for how long, and its handler if seen."""
    probe = _probe_of(evidence, address)
    pid = f" (pid {probe['pid']})" if probe.get("pid") else ""
    said = [f"a weight update never completed on the inference server {address}{pid}"]
    for process in {p.pid: p for p, _ in requests}.values():
        pending = max(float(t.get("pending_s") or 0) for p, t in requests if p is process)
        where = _at(process, first(process, in_weight_update))
        said.append(f"{names([process])} waits for its answer in {where} for {pending:.0f} s")
    if handler is not None:
        said.append(f"the server's request thread is still in its update handler "
                    f"{_at(None, handler)}")  # fmt: skip
    return ": ".join(said[:2]) + "".join(f", and {x}" for x in said[2:])


def _at(process: RankEvidence | None, frame: Frame | None) -> str:
    if frame is None:
        return "a weight update"
    where = display_path(frame.filename, process.cwd if process else None)
    return f"{frame.name}() at {where}:{frame.line}"


def _probe_of(evidence: Evidence, address: str) -> dict[str, Any]:
    """The server's probe, else what its process says."""
    probe = next((s for s in evidence.servers if s.get("address") == address), None)
    if probe is not None:
        return probe
    process = next((p for p in evidence.workers if p.address == address), None)
    known = {"node": process.node, "pid": process.pid} if process else {}
    return {"address": address, **known}
