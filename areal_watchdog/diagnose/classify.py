"""The hang classifier: a pure function from gathered evidence to a verdict.

Ranks are grouped by stack signature (the user's call sites plus the library call they are
blocked in; library internals folded). The dominant group is usually healthy; the outliers point
at the culprit. See ``docs/hang-categories.md`` for the evidence behind each category.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from areal_watchdog.common.rankset import ranks_phrase
from areal_watchdog.diagnose.collectives import analyse
from areal_watchdog.diagnose.record import record_finding
from areal_watchdog.diagnose.rollout import RolloutFinding, rollout_finding
from areal_watchdog.evidence.model import (
    BLOCKED,
    EXITED,
    MISSING,
    RUNNING,
    UNRESPONSIVE,
    Evidence,
    Frame,
    RankEvidence,
    ThreadStack,
)

COLLECTIVE_OPS = frozenset(
    [
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_single",  # FSDP2's parameter all-gather (torch >= 2.12)
        "all_gather_coalesced",
        "all_gather_object",
        "all_to_all",
        "all_to_all_single",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "reduce_scatter_single",  # FSDP2's gradient reduce-scatter (torch >= 2.12)
        "broadcast",
        "broadcast_object_list",
        "barrier",
        "monitored_barrier",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "_all_gather_base",
        "_reduce_scatter_base",
        "all_reduce_coalesced",
    ]
)
P2P_OPS = frozenset(
    [
        "send",
        "recv",
        "isend",
        "irecv",
        "send_object_list",
        "recv_object_list",
        "batch_isend_irecv",
        "_shape_inference",
    ]
)
INIT_OPS = frozenset(
    [
        "init_process_group",
        "_store_based_barrier",
        "rendezvous",
        "next_rendezvous",
        "_create_c10d_store",
        "_env_rendezvous_handler",
        "_tcp_rendezvous_handler",
        "new_group",
        "_new_group_with_tag",
        "init_device_mesh",
    ]
)
CLEANUP_NAMES = frozenset(
    [
        "destroy_process_group",
        "__exit__",
        "__del__",
        "close",
        "shutdown",
        "cleanup",
        "teardown",
        "finalize",
        "_exit_function",
    ]
)
CLEANUP_HINT = re.compile(r"(cleanup|clean_up|teardown|shutdown|finali[sz]e|destroy)", re.I)
BACKWARD_OPS = frozenset({"backward", "_engine_run_backward", "run_backward"})
DATALOADER_OPS = frozenset({"__next__", "_next_data", "_get_data", "_try_get_data"})
DISTRIBUTED_CALLS = COLLECTIVE_OPS | P2P_OPS | INIT_OPS
# Library waits with no user code above them: a thread with nothing to do (AReaL's idle
# EngineWorker waits in Queue.get), not a rank at work.
IDLE_WAITS = frozenset({"wait", "get", "select", "poll", "sleep", "accept", "_worker"})
ENGINE_THREAD = "EngineWorker"  # AReaL's rpc_server runs all engine work in this thread
ROLLOUT_CALLS = frozenset(
    {"prepare_batch", "wait_results", "active_submit_and_wait", "rollout_batch"}
)
_OUR_FILES = ("areal_watchdog/rank_main.py", "areal_watchdog/rank/", "runpy")
_SECONDARY_FAILURE = re.compile(
    r"connection (closed|reset)|broken pipe|econnreset|connection refused|timed? ?out|"
    r"DistNetworkError|DistBackendError|SignalException|SIGTERM|recvBytes|sendBytes|"
    r"peer .*(closed|reset)",
    re.I,
)
_PEER_ADDRESS = re.compile(r"\[([0-9a-fA-F.:]+)\]:(\d+)")


@dataclass
class Activity:
    """What one rank is doing, reduced to what matters for classification."""

    kind: (
        str  # collective | p2p | init | cleanup | dataloader | rollout | running | exited | unknown
    )
    op: str  # the library call it waits in, or the innermost user function
    signature: str  # grouping key: op plus the user call sites
    where: str  # for people: "all_reduce at train.py:88 in step() <- main()"


@dataclass
class StackGroup:
    """Ranks that share one stack signature."""

    signature: str
    where: str
    kind: str
    ranks: list[int]


@dataclass
class Verdict:
    """The classifier's answer."""

    category: str
    confidence: float
    culprit_ranks: list[int]
    summary: str
    groups: list[StackGroup] = field(default_factory=list)
    culprit_nodes: list[str] = field(default_factory=list)
    collectives: dict[str, Any] | None = None  # the Flight Recorder analysis, when available
    cause: str | None = None  # rollout_stalled: why the rollouts do not come
    activities: dict[int, Activity] = field(default_factory=dict)  # what each rank is doing
    culprit_workers: list[dict[str, Any]] = field(default_factory=list)  # culprits, not ranks
    worker_activities: dict[int, Activity] = field(default_factory=dict)  # other parts, by pid


def classify(evidence: Evidence) -> Verdict:
    """Classify a stall or failure; never raises on odd evidence, falls back to ``unknown``.

    Evidence with no rank at all but Flight Recorder dumps (``areal-launch diagnose DIR``) is
    judged on the collective record alone."""
    if not evidence.ranks and _dumps(evidence):
        return _from_record(evidence)
    activities = {r.rank: describe(r) for r in evidence.ranks}
    groups = _group(evidence.ranks, activities)
    finding = rollout_finding(evidence)
    verdict = _from_finding(finding) if finding else _decide(evidence, activities)
    verdict.groups = groups
    verdict.activities = activities
    verdict.worker_activities = {w.pid or 0: describe(w) for w in evidence.workers}
    _weigh_collectives(verdict, evidence)
    nodes = {r.rank: r.node for r in evidence.ranks}
    culprit_nodes = {nodes[r] for r in verdict.culprit_ranks if nodes.get(r)}
    culprit_nodes |= {w["node"] for w in verdict.culprit_workers if w.get("node")}
    if verdict.category == "node_lost":
        culprit_nodes |= set(evidence.lost_nodes)
    verdict.culprit_nodes = sorted(culprit_nodes)
    return verdict


def ended_cleanly(evidence: Evidence) -> bool:
    """Every process of the job exited, each with code 0: a silence at the end of a job, not
    a hang (the ranks' teardown can outlast the stall threshold before the launcher records
    the end). A process still alive (an AReaL controller stuck in its teardown) is no end."""
    processes = evidence.processes()
    return bool(processes) and all(
        p.state == EXITED and p.exit is not None and p.exit.code == 0 and not p.exit.exc_type
        for p in processes
    )


def _from_finding(finding: RolloutFinding) -> Verdict:
    return Verdict(
        category=finding.category,
        confidence=finding.confidence,
        culprit_ranks=finding.culprit_ranks,
        summary=finding.summary,
        cause=finding.cause,
        culprit_workers=finding.culprit_workers,
    )


HANG_CATEGORIES = (
    "collective_mismatch",
    "collective_stuck",
    "cleanup_deadlock",
    "straggler",
    "dataloader_stall",
    "p2p_mismatch",
    "unknown",
)


def _dumps(evidence: Evidence) -> dict[int, dict[str, Any]]:
    return {int(r): t for r, t in evidence.flight_records.items() if t.get("entries")}


def _from_record(evidence: Evidence) -> Verdict:
    record = analyse(_dumps(evidence), evidence.world_size)
    finding = record_finding(record)
    return Verdict(
        finding.category,
        finding.confidence,
        finding.culprit_ranks,
        finding.summary,
        collectives={**record.to_dict(), "agreement": "no stacks: the collective record alone"},
    )


def _weigh_collectives(verdict: Verdict, evidence: Evidence) -> None:
    """Put the Flight Recorder record beside the stacks: a decisive mismatch (operations that
    disagree at one sequence id, not a tie) decides which rank diverged; the report says whether
    the two agree."""
    dumps = _dumps(evidence)
    if not dumps:
        return
    record = analyse(dumps, evidence.world_size)
    named = record.culprit_ranks
    before = (verdict.category, list(verdict.culprit_ranks))
    finding = record.decisive_mismatch
    if (
        finding is not None
        and verdict.category in HANG_CATEGORIES
        and set(named) != set(verdict.culprit_ranks)
    ):
        stacks_said = (
            f"the stacks alone suggested {before[0]} naming "
            f"{ranks_phrase(before[1]) if before[1] else 'no rank'}"
        )
        verdict.category, verdict.culprit_ranks, verdict.confidence = (
            "collective_mismatch",
            named,
            0.9,
        )
        verdict.summary = (
            f"The collective record shows that {finding.description}: "
            f"{ranks_phrase(named)} diverged ({stacks_said})."
        )
    if not named or not before[1]:
        agreement = (
            "the collective record names no rank" if not named else "the stacks named no rank"
        )
    elif set(named) == set(before[1]):
        agreement = "the stacks and the collective record name the same ranks"
    else:
        agreement = (
            f"the stacks named {ranks_phrase(before[1])}, the collective record "
            f"{ranks_phrase(named)}"
        )
    verdict.collectives = {**record.to_dict(), "agreement": agreement}


def describe(rank: RankEvidence) -> Activity:
    """Reduce one rank's evidence to an Activity."""
    if rank.state == EXITED:
        return _exited_activity(rank)
    if rank.state in (MISSING, UNRESPONSIVE):
        label = "never started" if rank.state == MISSING else "no stack"
        return Activity("unknown", label, f"<{rank.state}>", label)
    thread = work_thread(rank)
    if thread is None or not thread.frames:
        return Activity("unknown", "no stack", "<no stack>", "no stack")
    frames = [f for f in thread.frames if not any(m in f.filename for m in _OUR_FILES)]
    user_frames = [f for f in frames if not _is_library(f)]
    op, kind = _blocking_op(frames, rank.cpu_utilization)
    rollout = [f for f in frames if _bare(f.name) in ROLLOUT_CALLS]
    if kind == "running" and rollout:  # waiting for rollouts: name AReaL's outermost call
        op, kind = _bare(rollout[-1].name), "rollout"
    elif kind == "running" and user_frames:
        op = user_frames[0].name
    elif kind == "running" and frames and _bare(frames[0].name) in IDLE_WAITS:
        op, kind = f"idle, waiting for work ({frames[0].name})", "idle"
    if any(
        _bare(f.name) in CLEANUP_NAMES or CLEANUP_HINT.search(f.name) for f in user_frames
    ) or any(f.name == "destroy_process_group" for f in frames):
        kind = "cleanup"
    sites = ";".join(f"{f.short_filename}:{f.line}:{f.name}" for f in user_frames)
    where = _where(op, user_frames)
    if thread.name and thread.name != "MainThread":
        where += f" (thread {thread.name})"
    return Activity(kind, op, f"{op}|{sites}", where)


def work_thread(rank: RankEvidence) -> ThreadStack | None:
    """The thread that carries the rank's distributed or rollout work, else the main thread.

    In AReaL's ``rpc_server`` the main thread only serves HTTP while FSDP and NCCL run in the
    ``EngineWorker`` thread; DeepSpeed issues all-gathers from the autograd thread. Preference:
    a thread inside a collective, P2P or rendezvous call, or anywhere in ``torch.distributed`` /
    c10d; then a thread in rollout work (``workflow_executor``, ``prepare_batch``,
    ``wait_results``); then the main thread, unless it only serves requests while another thread
    runs (py-spy's ``active`` flag): then that thread. Ties go to the main thread, then to the
    first thread listed. The watchdog's own threads (``areal-*``) are never chosen."""
    main = rank.main_thread()
    best, best_score = None, 0
    for thread in rank.threads:
        score = _work_score(thread)
        if score and thread is not main and _ours(thread):
            score = 0
        if score > best_score or (score == best_score and score and thread is main):
            best, best_score = thread, score
    if best is not None:
        return best
    if main is not None and _serving(main):
        busy = [t for t in rank.threads if t is not main and t.active and not _ours(t)]
        engine = [t for t in rank.threads if t.name == ENGINE_THREAD]
        if busy or engine:
            return (busy or engine)[0]
    return main


_DISTRIBUTED_FILES = ("torch/distributed/", "c10d")
_SERVE_LOOPS = frozenset({"serve_forever", "run_simple", "run_forever", "handle_request"})


def _work_score(thread: ThreadStack) -> int:
    """2: distributed work, 1: rollout work, 0: neither."""
    score = 0
    for frame in thread.frames:
        name = _bare(frame.name)
        if name in DISTRIBUTED_CALLS or any(m in frame.filename for m in _DISTRIBUTED_FILES):
            return 2
        if name in ROLLOUT_CALLS or "workflow_executor" in frame.filename:
            score = 1
    return score


def _ours(thread: ThreadStack) -> bool:
    """A helper thread the watchdog started in the rank (listeners): by name, or by its frames
    when faulthandler gave no name. Only ever asked of threads other than the main thread."""
    if thread.name and thread.name.startswith("areal-"):
        return True
    return any("areal_watchdog/" in f.filename for f in thread.frames)


def _serving(thread: ThreadStack) -> bool:
    """The thread sits in a request-serving loop (http.server, werkzeug, an event loop)."""
    return any(_bare(f.name) in _SERVE_LOOPS for f in thread.frames)


def _bare(name: str) -> str:
    """``Trainer.__exit__`` -> ``__exit__``."""
    return name.rsplit(".", 1)[-1]


def _exited_activity(rank: RankEvidence) -> Activity:
    info = rank.exit
    if info is None:
        return Activity("exited", "exited", "<exited>", "exited (no exit record)")
    if info.exc_type:
        site = _raise_site(info.traceback or "")
        label = f"raised {info.exc_type}" + (f" at {site}" if site else "")
        return Activity("exited", info.exc_type, f"<exception {info.exc_type} {site}>", label)
    code = info.code
    label = "exited with code 0" if code == 0 else _describe_code(code)
    return Activity("exited", label, f"<{label}>", label)


def _describe_code(code: int | None) -> str:
    if code is None:
        return "exited (code unknown)"
    if code < 0:
        return f"killed by signal {-code}"
    return f"exited with code {code}"


def _raise_site(traceback_text: str) -> str:
    sites = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', traceback_text)
    user = [
        s
        for s in sites
        if "site-packages" not in s[0] and "runpy" not in s[0] and "areal_watchdog" not in s[0]
    ]
    if not user:
        return ""
    path, line, name = user[-1]
    return f"{Frame(name, path, int(line)).short_filename}:{line} in {name}()"


def _is_library(frame: Frame) -> bool:
    path = frame.filename
    return (
        "site-packages" in path
        or "dist-packages" in path
        or path.startswith("<")
        or bool(re.search(r"/lib/python3\.\d+/", path))
    )


def _blocking_op(frames: list[Frame], cpu_recent: float | None) -> tuple[str, str]:
    """The library call the rank is in and its kind, scanning from the innermost frame."""
    for frame in frames:
        name = _bare(frame.name)
        if name in INIT_OPS:
            return name, "init"
        if name in P2P_OPS:
            return name, "p2p"
        if name in COLLECTIVE_OPS:
            return name, "collective"
        if "torch/utils/data/" in frame.filename and name in DATALOADER_OPS:
            return "DataLoader.__next__", "dataloader"
        if name in BACKWARD_OPS and "torch/" in frame.filename:
            # DDP's gradient all_reduce runs inside backward: a backward that burns no CPU
            # is waiting for its peers.
            if cpu_recent is not None and cpu_recent < 0.1:
                return "backward (DDP gradient all_reduce)", "collective"
            return "backward", "running"
    innermost = frames[0].name if frames else "?"
    return innermost, "running"


def _where(op: str, user_frames: list[Frame]) -> str:
    if not user_frames:
        return op

    def call(frame: Frame) -> str:
        return frame.name if frame.name.startswith("<") else f"{frame.name}()"

    first = user_frames[0]
    callers = "".join(f" <- {call(f)}" for f in user_frames[1:4])
    more = " <- ..." if len(user_frames) > 4 else ""
    subject = "" if op == first.name else f"{op} "
    return f"{subject}at {first.short_filename}:{first.line} in {call(first)}{callers}{more}"


def _group(ranks: list[RankEvidence], activities: dict[int, Activity]) -> list[StackGroup]:
    by_signature: dict[str, StackGroup] = {}
    for rank in ranks:
        act = activities[rank.rank]
        group = by_signature.setdefault(
            act.signature, StackGroup(act.signature, act.where, act.kind, [])
        )
        group.ranks.append(rank.rank)
    return sorted(by_signature.values(), key=lambda g: (-len(g.ranks), min(g.ranks)))


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


def _decide(evidence: Evidence, acts: dict[int, Activity]) -> Verdict:
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
        f"Before the first step, {ranks_phrase(in_init)} wait in {acts[in_init[0]].op} "
        f"for their peers; {late}.",
    )


def _never_registered(scene: Scene) -> Verdict | None:
    if not scene.missing:
        return None
    return Verdict(
        "unknown",
        0.3,
        sorted(scene.missing),
        f"{ranks_phrase(scene.missing)} never registered with the watchdog.",
    )


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
        f"{_cap(ranks_phrase(cleanup))} already left the training loop and {_is(cleanup)} "
        f"in cleanup ({acts[cleanup[0]].where}) while {ranks_phrase(rest)} still wait in "
        f"{acts[rest[0]].where}: the loop was left early (an early break or an exception).",
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
        f"{_cap(ranks_phrase(culprits))} wait{_s(culprits)} in point-to-point "
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
        f"{_cap(ranks_phrase(loaders))} {_is(loaders)} blocked fetching data "
        f"({scene.acts[loaders[0]].where}) while {ranks_phrase(collective)} wait in "
        f"{scene.acts[collective[0]].op}.",
    )


def _straggler(scene: Scene) -> Verdict | None:
    waiting = scene.kind("collective", "p2p")
    busy = scene.kind("running", "dataloader") + scene.unresponsive
    if not (waiting and busy):
        return None
    return Verdict(
        "straggler",
        0.8 if len(busy) < len(waiting) else 0.55,
        sorted(busy),
        f"{_cap(ranks_phrase(busy))} {_is(busy)} still in ordinary code "
        f"({_first_where(busy, scene.acts)}) while {ranks_phrase(waiting)} wait{_s(waiting)} in "
        f"{scene.acts[waiting[0]].op}: a straggler, not a code-path difference.",
    )


def _collective_stuck(scene: Scene) -> Verdict | None:
    collective, acts = scene.kind("collective"), scene.acts
    if not collective or len(collective) != len(scene.alive):
        return None
    if len({acts[r].signature for r in collective}) != 1:
        return None
    where = acts[collective[0]].where
    frozen = [r.rank for r in scene.alive if r.process_status == "stopped"]
    if frozen:
        return Verdict(
            "collective_stuck",
            0.8,
            sorted(frozen),
            f"All {len(collective)} ranks wait in the same collective ({where}), and "
            f"{ranks_phrase(frozen)} {_is(frozen)} stopped (SIGSTOP or a debugger): a frozen peer.",
        )
    return Verdict(
        "collective_stuck",
        0.7,
        [],
        f"All {len(collective)} ranks wait in the same collective ({where}): the code paths "
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
        f"{_cap(ranks_phrase(culprits))} {_is(culprits)} blocked in {acts[culprits[0]].where} "
        f"while {ranks_phrase(dominant)} wait in {acts[dominant[0]].where}: the ranks took "
        f"different code paths."
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
    _crashed,
    _init_deadlock,
    _never_registered,
    _no_stack,
    _cleanup_deadlock,
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
            f"{_cap(ranks_phrase(culprits))} failed first: {acts[first.rank].where}"
            f"{_error_line(first)}{tail}.{peer_note}",
        )
    if quiet and others_failed_or_waiting:
        quiet_ranks = [r.rank for r in quiet]
        return Verdict(
            "rank_crashed",
            0.85,
            sorted(quiet_ranks),
            f"{_cap(ranks_phrase(quiet_ranks))} exited with code 0 while "
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
            f"{_cap(ranks_phrase([first.rank]))} failed first ({acts[first.rank].where}"
            f"{_error_line(first)}); every failure looks like a consequence of a lost peer."
            f"{peer_note}",
        )
    return Verdict(
        "rank_crashed",
        0.3,
        [],
        "The job failed but no rank left an exit record; see the log tails.",
    )


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


def _error_line(rank: RankEvidence) -> str:
    info = rank.exit
    if info is None or not info.message:
        return ""
    message = info.message.strip().splitlines()[0][:160] if info.message.strip() else ""
    return f" ({message})" if message else ""


def _first_where(rank_ids: list[int], acts: dict[int, Activity]) -> str:
    return acts[rank_ids[0]].where if rank_ids and rank_ids[0] in acts else "not seen"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _s(ranks: list[int]) -> str:
    return "s" if len(ranks) == 1 else ""


def _is(ranks: list[int]) -> str:
    return "is" if len(ranks) == 1 else "are"
