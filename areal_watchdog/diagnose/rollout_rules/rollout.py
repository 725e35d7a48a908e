"""Hangs on the rollout side of RL training: the trainer waits for rollouts, or for a weight
transfer to the inference servers. Pure: reads stacks, task dumps, server probes and log tails
of every process of the job (a torchrun rank in SPMD, or AReaL's single controller and its
rollout workers).

Rules, in order (docs/hang-categories.md):

1. ``weight_sync_stuck`` (``weight_sync``): a weight update that some inference servers never
   complete, or a weight transfer the inference side never entered.
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
from dataclasses import dataclass
from typing import Any

from areal_watchdog.diagnose.one_process.frames import bare, display_path, is_library_path
from areal_watchdog.diagnose.phrases import cap, count, is_are, noun, verb
from areal_watchdog.diagnose.rollout_rules.exceptions import repeated_exception
from areal_watchdog.diagnose.rollout_rules.rollout_evidence import (
    EPISODE_CALLS,
    GENERATION_CALLS,
    RolloutFinding,
    addresses,
    bare_name,
    first,
    link_name,
    names,
    server_entry,
)
from areal_watchdog.diagnose.rollout_rules.weight_sync import weight_sync_finding
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
# A capacity wait: ours and AReaL's names for it; AReaL's dispatcher waits for capacity (or for
# work, or a resume) in _get_next_task_for_submission, in the rollout worker or the SPMD rank.
_CAPACITY = re.compile(r"capacity|staleness|_get_next_task_for_submission", re.I)
_REJECTED = re.compile(r"rejected|episode failed|workflow.*(failed|error)", re.I)
REJECTIONS_FOR_FAILING = 3  # rejection lines in one rank's log tail that mean "every episode"


@dataclass(frozen=True)
class _Cause:
    name: str
    confidence: float
    culprits: list[dict[str, Any]]
    why: str


def rollout_finding(evidence: Evidence) -> RolloutFinding | None:
    """A finding when the job waits on its rollout side or on a weight transfer, else None."""
    live = [p for p in evidence.processes() if p.state in (BLOCKED, RUNNING)]
    held = weight_sync_finding(evidence, live)
    if held is not None:
        return held
    waiting = [(p, f) for p in live if (f := first(p, lambda f: bare_name(f) in ROLLOUT_WAITS))]
    if not waiting:
        return None
    return _rollout_stalled(evidence, waiting)


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
        f"{cap(names(who))} {is_are(who)} waiting for rollouts in {bare_name(frame)}() at "
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
            servers = f"the inference {noun(bad, 'server')} {addresses(bad)}"
            what = one if len(bad) == 1 else many
            return _Cause(cause, 0.9, [server_entry(s) for s in bad], f"{servers} {what}")
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
        held += f"; a weight update is in flight on {addresses(updating)}"
    return _Cause(
        "inference_paused",
        0.9 if said else 0.7,
        [server_entry(s) for s in paused],
        f"the inference {noun(paused, 'server')} {addresses(paused)} {is_are(paused)} paused "
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
        f"{count(len(holders), 'episode')} in {names(owners)} {verb(holders, 'wait')} for "
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
    holders = [(p, t) for p, t in holders if link_name(t["chain"][-1]) not in EPISODE_CALLS]
    if not holders:  # only AReaL's wrappers, awaiting episodes that are gone
        return None
    stuck_at = _await_site(holders[0][1], holders[0][0].cwd)
    oldest = max(float(t.get("pending_s") or 0.0) for _, t in holders)
    owners = list({p.pid: p for p, _ in holders}.values())
    return _Cause(
        "workflow_stuck",
        0.85,
        [culprit_entry(p) for p in owners],
        f"{count(len(holders), 'episode')} in {names(owners)} {verb(holders, 'wait')} inside "
        f"the workflow at {stuck_at} "
        f"(up to {oldest:.0f} s), not on an inference server: a tool, a sandbox or a lock that "
        "never returns",
    )


def _workflow_failing(evidence: Evidence) -> _Cause | None:
    tails = [p.log_tail for p in evidence.processes()]
    rejected, tail = max(((len(_REJECTED.findall(t)), t) for t in tails), default=(0, ""))
    if rejected < REJECTIONS_FOR_FAILING:
        return None
    why = (
        f"episodes keep failing and being rejected ({rejected} rejections in one log tail), "
        "so the batch never fills"
    )
    found = repeated_exception(tail)
    if found is not None:
        why += f"; the same exception each time ({found[1]} times): `{found[0]}`"
    return _Cause("workflow_failing", 0.75, [], why)


def _staleness_blocked(evidence: Evidence) -> _Cause | None:
    live = [p for p in evidence.processes() if p.state in (BLOCKED, RUNNING)]
    capacity_wait = [p for p in live if first(p, lambda f: _CAPACITY.search(f.name))]
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
    return any(link_name(link) in EPISODE_CALLS for link in task.get("chain", []))


def _is_generating(task: dict[str, Any]) -> bool:
    return any(link_name(link) in GENERATION_CALLS for link in task.get("chain", []))


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
    return f"{link_name(link)}() at {display_path(link['filename'], cwd)}:{link['line']}{awaiting}"


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
