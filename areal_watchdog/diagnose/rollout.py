"""Hangs on the rollout side of RL training: the trainer waits for rollouts, or for a weight
transfer to the inference servers. Pure: reads stacks, task dumps, server probes and log tails
of every process of the job (a torchrun rank in SPMD, or AReaL's single controller and its
rollout workers).

Rules, in order (docs/hang-categories.md):

1. ``weight_sync_stuck``: a weight update (disk or distributed) that some inference servers
   never complete: the updating processes' pending requests still await them, or their own
   request threads are still in an update handler (``_lost_update``); else a process is inside
   a trainer-to-inference weight transfer (``update_weights_from_distributed``,
   ``init_weights_update_group``, ...) and blocked, while the inference side is not
   transferring (AReaL #1439: the server never entered recv).
2. ``rollout_stalled``: a process waits for rollouts (``prepare_batch``, ``wait_results``,
   ``active_submit_and_wait``, a capacity wait); the ``cause`` comes from the evidence:
   ``inference_unreachable`` (a server refuses connections), ``inference_wedged`` (a server
   accepts but does not answer its health check), ``inference_paused`` (a server reports itself
   paused, or holds queued requests with none running while the job's tasks await it),
   ``workflow_failing`` (episodes keep being rejected), ``reward_stuck`` (the pending episodes
   wait for a reward function that never returns, in AReaL's reward process pool: their
   samples silently score 0), ``workflow_stuck`` (the pending
   episodes wait inside the workflow, on something that is not an inference server: a tool, a
   sandbox, a lock), ``staleness_blocked`` (a capacity wait with no rollout in flight: nothing will
   ever free capacity), or ``unknown``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from areal_watchdog.common.rankset import ranks_phrase
from areal_watchdog.diagnose.frames import bare, display_path, is_areal, is_library_path
from areal_watchdog.diagnose.phrases import cap, count, is_are, noun, them, verb
from areal_watchdog.diagnose.verdict import culprit_entry
from areal_watchdog.evidence.model import (
    BLOCKED,
    HELPER,
    RUNNING,
    Evidence,
    Frame,
    RankEvidence,
)

ROLLOUT_WAITS = frozenset(
    {
        "prepare_batch",
        "rollout_batch",
        "wait_results",
        "active_submit_and_wait",
        "wait_for_capacity",
    }
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
SERVER = "inference_server"
EPISODE_CALLS = frozenset(
    {"_execute_workflow", "arun_episode", "agenerate", "arequest_with_retry", "generate"}
)
# An episode's own calls: a pending request under none of them is no generation (an update's).
EPISODE_ROOTS = frozenset({"_execute_workflow", "arun_episode", "agenerate", "generate"})
GENERATION_CALLS = frozenset({"agenerate", "arequest_with_retry", "generate", "_arequest"})
# A capacity wait: ours and AReaL's names for it; AReaL's dispatcher waits for capacity (or for
# work, or a resume) in _get_next_task_for_submission, in the rollout worker or the SPMD rank.
_CAPACITY = re.compile(r"capacity|staleness|_get_next_task_for_submission", re.I)
_REJECTED = re.compile(r"rejected|episode failed|workflow.*(failed|error)", re.I)
REJECTIONS_FOR_FAILING = 3  # rejection lines in one rank's log tail that mean "every episode"


@dataclass
class RolloutFinding:
    """What the rollout rules concluded; the classifier turns it into its Verdict."""

    category: str
    cause: str | None
    confidence: float
    culprit_ranks: list[int]
    summary: str
    culprit_workers: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class _Cause:
    name: str
    confidence: float
    culprits: list[dict[str, Any]]
    why: str


def rollout_finding(evidence: Evidence) -> RolloutFinding | None:
    """A finding when the job waits on its rollout side or on a weight transfer, else None."""
    live = [p for p in evidence.processes() if p.state in (BLOCKED, RUNNING)]
    updating = [(p, f) for p in live if p.role != SERVER and (f := _first(p, _in_weight_update))]
    lost = _lost_update(evidence, updating) if updating else None
    if lost is not None:
        return lost
    syncing = [(p, f) for p in live if (f := _first(p, lambda f: _WEIGHT_SYNC.search(f.name)))]
    if syncing:
        return _weight_sync(evidence, syncing)
    waiting = [(p, f) for p in live if (f := _first(p, lambda f: _bare(f) in ROLLOUT_WAITS))]
    if not waiting:
        return None
    return _rollout_stalled(evidence, waiting)


def _weight_sync(evidence: Evidence, syncing: list[tuple[RankEvidence, Frame]]) -> RolloutFinding:
    who = [p for p, _ in syncing]
    frame = syncing[0][1]
    idle = [s for s in evidence.servers if s.get("state") == "up" and not s.get("running")]
    others = sorted(r.rank for r in evidence.ranks if r not in who and r.rank is not None)
    side = (
        f"the inference {noun(idle, 'server')} {_addresses(idle)} {is_are(idle)} up and idle "
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
        f"{cap(_names(who))} {is_are(who)} blocked sending weights in {_bare(frame)}() at "
        f"{display_path(frame.filename, who[0].cwd)}:{frame.line}, and {side}{rest}.",
        [_server(s) for s in idle],
    )


def _in_weight_update(frame: Frame) -> bool:
    """A weight-transfer call; a user's own ``update_weights`` (a DDP job's) is none."""
    if _WEIGHT_UPDATE.search(frame.name):
        return True
    return _bare(frame) == "update_weights" and is_areal(frame.filename)


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
        if p.role == SERVER and p.address and (f := _first(p, _in_weight_update))
    }
    held = sorted(set(awaited) | set(handling))
    if not held:
        return None
    direct = list({p.pid: p for a in held for p, _ in awaited.get(a, [])}.values())
    others = [(p, f) for p, f in updating if p not in direct]
    servers = [_server(_probe_of(evidence, a)) for a in held]
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
            if address in servers and not _links(task) & EPISODE_ROOTS:
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
        text += " " + cap("; ".join(f"{_names([p])} waits in {_at(p, f)}" for p, f in others))
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
        where = _at(process, _first(process, _in_weight_update))
        said.append(f"{_names([process])} waits for its answer in {where} for {pending:.0f} s")
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


def _rollout_stalled(
    evidence: Evidence, waiting: list[tuple[RankEvidence, Frame]]
) -> RolloutFinding:
    who = [p for p, _ in waiting]
    frame = waiting[0][1]
    cause = _cause(evidence)
    return RolloutFinding(
        "rollout_stalled",
        cause.name,
        cause.confidence,
        [],
        f"{cap(_names(who))} {is_are(who)} waiting for rollouts in {_bare(frame)}() at "
        f"{display_path(frame.filename, who[0].cwd)}:{frame.line}: {cause.why}.",
        cause.culprits,
    )


def _cause(evidence: Evidence) -> _Cause:
    rules = (_server_down, _server_paused, _workflow_failing, _reward_stuck, _workflow_stuck)
    for rule in rules:
        found = rule(evidence)
        if found is not None:
            return found
    return _staleness_blocked(evidence) or _Cause(
        "unknown", 0.4, [], "the inference servers look healthy; read the task dumps"
    )


def _server_down(evidence: Evidence) -> _Cause | None:
    for state, cause, one, many in (
        ("unreachable", "inference_unreachable", "refuses connections (dead?)",
         "refuse connections (dead?)"),
        ("unresponsive", "inference_wedged", "accepts connections but does not answer /health",
         "accept connections but do not answer /health"),
        ("unhealthy", "inference_wedged", "answers /health with an error",
         "answer /health with an error"),
    ):  # fmt: skip
        bad = [s for s in evidence.servers if s.get("state") == state]
        if bad:
            servers = f"the inference {noun(bad, 'server')} {_addresses(bad)}"
            what = one if len(bad) == 1 else many
            return _Cause(cause, 0.9, [_server(s) for s in bad], f"{servers} {what}")
    return None


def _server_paused(evidence: Evidence) -> _Cause | None:
    awaited = {t["awaiting"] for p in evidence.processes() for t in p.tasks if t.get("awaiting")}
    paused = [s for s in evidence.servers if _looks_paused(s, awaited)]
    if not paused:
        return None
    queued = sum(int(s.get("queued") or 0) for s in paused)
    said = any(s.get("paused") is True for s in paused)
    held = (
        f"with {count(queued, 'request')} queued"
        if queued or not said
        else "holding the job's requests"
    )
    if not queued and not said:
        held = (
            "holding the job's requests before its engine, none running and none waiting "
            "(AReaL's vLLM pause gate: /areal_pause_generation without "
            "/areal_continue_generation?)"
        )
    updating = [s for s in paused if s.get("updating_weights")]
    if updating:
        held += f"; a weight update is in flight on {_addresses(updating)}"
    return _Cause(
        "inference_paused",
        0.9 if said else 0.7,
        [_server(s) for s in paused],
        f"the inference {noun(paused, 'server')} {_addresses(paused)} {is_are(paused)} paused "
        "(generation paused for a weight "
        f"update and never resumed?) {held}",
    )


def _reward_stuck(evidence: Evidence) -> _Cause | None:
    """Episodes wait for the reward function, which AReaL runs in a process pool (a child of
    the rollout worker) under a timeout: when it never returns, AReaL retries, gives up and
    scores the sample 0, silently. The pool's process is a helper of the worker: name the
    reward function it is stuck in, and where."""
    holders = [
        (p, t)
        for p in evidence.processes()
        for t in p.tasks
        if _is_episode(t) and any(_is_reward_call(link) for link in t.get("chain", []))
    ]
    if not holders:
        return None
    stuck = [(h, f) for h in evidence.workers if h.role == HELPER and (f := _reward_frame(h))]
    owners = list({p.pid: p for p, _ in holders}.values())
    oldest = max(float(t.get("pending_s") or 0.0) for _, t in holders)
    what = "the reward function (its process-pool process was not found)"
    if stuck:
        helper, frame = stuck[0]
        parent = next((p for p in evidence.processes() if p.pid == helper.parent_pid), None)
        child = f", a child of {parent.label()}" if parent is not None else ""
        what = (
            f"the reward function {bare(frame.name)}(), stuck at {_innermost(helper, frame)} in "
            f"its process-pool process (pid {helper.pid}{child})"
        )
    return _Cause(
        "reward_stuck",
        0.85,
        [culprit_entry(h) for h, _ in stuck] or [culprit_entry(p) for p in owners],
        f"{count(len(holders), 'episode')} in {_names(owners)} {verb(holders, 'wait')} for "
        f"{what} for up to {oldest:.0f} "
        "s: AReaL gives up after its reward timeout and scores the sample 0, so rewards are "
        "silently falling back to 0",
    )


def _innermost(helper: RankEvidence, called: Frame) -> str:
    """Where the reward function is stuck: the innermost of the user's frames, else the call."""
    thread = next(t for t in helper.threads if called in t.frames)
    frames = thread.frames[: thread.frames.index(called) + 1]
    frame = next((f for f in frames if not is_library_path(f.filename)), called)
    return f"{display_path(frame.filename, helper.cwd)}:{frame.line}"


def _is_reward_call(link: dict[str, Any]) -> bool:
    name, filename = str(link.get("name", "")), str(link.get("filename", ""))
    return "RewardWrapper" in name or filename.endswith("reward_api.py")


def _reward_frame(helper: RankEvidence) -> Frame | None:
    """The function a process-pool worker runs: the frame ``_process_worker`` called."""
    for thread in helper.threads:
        names = [bare(f.name) for f in thread.frames]
        if "_process_worker" in names:
            index = names.index("_process_worker")
            callee = thread.frames[index - 1] if index > 0 else None
            if callee is not None and bare(callee.name) != "get":
                return callee
    return None


def _workflow_stuck(evidence: Evidence) -> _Cause | None:
    """Every pending episode waits inside the workflow, on no inference server."""
    holders = [(p, t) for p in evidence.processes() for t in p.tasks if _is_episode(t)]
    if not holders or any(_is_generating(t) for _, t in holders):
        return None
    holders = [(p, t) for p, t in holders if _link(t["chain"][-1]) not in EPISODE_CALLS]
    if not holders:  # only AReaL's wrappers, awaiting episodes that are gone
        return None
    stuck_at = _await_site(holders[0][1], holders[0][0].cwd)
    oldest = max(float(t.get("pending_s") or 0.0) for _, t in holders)
    owners = list({p.pid: p for p, _ in holders}.values())
    return _Cause(
        "workflow_stuck",
        0.85,
        [culprit_entry(p) for p in owners],
        f"{count(len(holders), 'episode')} in {_names(owners)} {verb(holders, 'wait')} inside "
        f"the workflow at {stuck_at} "
        f"(up to {oldest:.0f} s), not on an inference server: a tool, a sandbox or a lock that "
        "never returns",
    )


def _workflow_failing(evidence: Evidence) -> _Cause | None:
    rejected = max((len(_REJECTED.findall(p.log_tail)) for p in evidence.processes()), default=0)
    if rejected < REJECTIONS_FOR_FAILING:
        return None
    return _Cause(
        "workflow_failing",
        0.75,
        [],
        f"episodes keep failing and being rejected ({rejected} rejections in one log tail), "
        "so the batch never fills",
    )


def _staleness_blocked(evidence: Evidence) -> _Cause | None:
    live = [p for p in evidence.processes() if p.state in (BLOCKED, RUNNING)]
    capacity_wait = [p for p in live if _first(p, lambda f: _CAPACITY.search(f.name))]
    if not capacity_wait or any(_is_episode(t) for p in evidence.processes() for t in p.tasks):
        return None
    return _Cause(
        "staleness_blocked",
        0.8,
        [],
        "the staleness control leaves no capacity to start a rollout and none is in flight "
        "(check max_head_offpolicyness and max_concurrent_rollouts per rollout worker)",
    )


def _is_episode(task: dict[str, Any]) -> bool:
    """A pending rollout: some link of its await chain is an episode or generation call."""
    return any(_link(link) in EPISODE_CALLS for link in task.get("chain", []))


def _is_generating(task: dict[str, Any]) -> bool:
    return any(_link(link) in GENERATION_CALLS for link in task.get("chain", []))


def _await_site(task: dict[str, Any], cwd: str | None) -> str:
    """The innermost link of the chain in the user's code (outside libraries), and the library
    call it awaits: ``run_tool() at tool_workflow.py:37 (awaiting Process.communicate)``."""
    chain = task.get("chain", [])
    user = [i for i, link in enumerate(chain) if not is_library_path(link["filename"])]
    if not user:
        return chain[-1]["name"] if chain else "an unknown await"
    link = chain[user[-1]]
    inner = chain[user[-1] + 1 :]
    awaiting = f" (awaiting {inner[0]['name']})" if inner else ""
    return f"{_link(link)}() at {display_path(link['filename'], cwd)}:{link['line']}{awaiting}"


def _links(task: dict[str, Any]) -> set[str]:
    return {_link(link) for link in task.get("chain", [])}


def _link(link: dict[str, Any]) -> str:
    return str(link.get("name", "")).rsplit(".", 1)[-1]


def _looks_paused(server: dict[str, Any], awaited: set[str]) -> bool:
    if server.get("state") != "up":
        return False
    if server.get("paused") is True or _gated(server, awaited):
        return True
    return bool(server.get("queued")) and not server.get("running") and server["address"] in awaited


def _gated(server: dict[str, Any], awaited: set[str]) -> bool:
    """A vLLM server whose engine holds nothing while the job's tasks await it: AReaL's
    ``areal_vllm_server`` keeps requests at its HTTP pause gate, before they reach the engine
    (no endpoint says so: AReaL issue #1160 happened on vLLM)."""
    idle = not server.get("running") and not server.get("queued")
    return server.get("engine") == "vllm" and idle and server.get("address") in awaited


def _first(process: RankEvidence, test: Any) -> Frame | None:
    """The outermost frame of any thread that passes ``test`` (the main thread first)."""
    main = process.main_thread()
    threads = [main, *(t for t in process.threads if t is not main)] if main else process.threads
    for thread in threads:
        for frame in reversed(thread.frames):
            if test(frame):
                return frame
    return None


def _server(server: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": SERVER,
        "address": server.get("address"),
        "state": server.get("state"),
        "node": server.get("node"),
        "pid": server.get("pid"),
    }


def _names(processes: list[RankEvidence]) -> str:
    """``rank 0``, ``ranks 0-3``, ``the controller (pid 12)``, ``rollout 0 (pid 14, node n1)``."""
    ranked = [p.rank for p in processes if p.rank is not None and p.role in (None, "rank")]
    parts = [ranks_phrase(sorted(ranked))] if ranked else []
    for p in processes:
        if p.rank is not None and p.role in (None, "rank"):
            continue
        name = "the controller" if p.role == "controller" else p.label()
        parts.append(f"{name} (pid {p.pid}{f', node {p.node}' if p.node else ''})")
    return ", ".join(parts)


def _addresses(servers: list[dict[str, Any]]) -> str:
    return ", ".join(str(s.get("address")) for s in servers)


def _bare(frame: Frame) -> str:
    return frame.name.rsplit(".", 1)[-1]
