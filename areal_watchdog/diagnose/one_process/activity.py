"""What one process is doing, from its stacks: the call it waits in, its kind (collective,
p2p, init, cleanup, dataloader, rollout, running: at work in its own code, blocked: in no known
wait but burning no CPU, idle, exited, unknown) and where, for people.

Pure: reads the evidence of one process; the rules (``rules``) compare processes.
"""

from __future__ import annotations

import re

from areal_watchdog.diagnose.one_process.frames import (
    bare,
    display_path,
    is_areal,
    is_distributed,
    is_library,
    is_library_path,
)
from areal_watchdog.diagnose.verdict import Activity
from areal_watchdog.evidence.model import (
    EXITED,
    MISSING,
    UNRESPONSIVE,
    Frame,
    RankEvidence,
    ThreadStack,
)

# Operation names, counted only in torch.distributed's frames (``frames.is_distributed``): the
# same names in requests (``HTTPAdapter.send``), zmq, asyncio or user code are no such wait.
COLLECTIVE_OPS = frozenset(
    [
        "all_reduce",
        "wait_tensor",  # functional collectives (DTensor.redistribute, FSDP2's state dict)
        "all_gather_tensor",
        "all_reduce_coalesced_inplace",
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
# Library waits with no user code above them: a thread with nothing to do (AReaL's idle
# EngineWorker waits in Queue.get), not a rank at work.
IDLE_WAITS = frozenset({"wait", "get", "select", "poll", "sleep", "accept", "_worker"})
ENGINE_THREAD = "EngineWorker"  # AReaL's rpc_server runs all engine work in this thread
ROLLOUT_CALLS = frozenset(
    {"prepare_batch", "wait_results", "active_submit_and_wait", "rollout_batch"}
)
# Our rank wrapper (rank/main.py; rank_main.py in the recorded fixtures of earlier builds)
_OUR_FILES = ("areal_watchdog/rank_main.py", "areal_watchdog/rank/", "runpy")
IDLE_CPU = 0.1  # cores: a rank below this over the last poll burns no CPU, it waits


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
    user_frames = [f for f in frames if not is_library(f)]
    op, kind = _blocking_op(frames, rank.cpu_utilization)
    rollout = [f for f in frames if bare(f.name) in ROLLOUT_CALLS]
    if kind == "running" and rollout:  # waiting for rollouts: name AReaL's outermost call
        op, kind = bare(rollout[-1].name), "rollout"
    elif kind == "running" and user_frames:
        op = user_frames[0].name
    elif kind == "running" and frames and bare(frames[0].name) in IDLE_WAITS:
        op, kind = f"idle, waiting for work ({frames[0].name})", "idle"
    if kind == "running" and _idle_cpu(rank):
        kind = "blocked"  # in no known wait, but burning no CPU: not at work
    if _in_cleanup(frames):
        kind = "cleanup"
    sites = ";".join(f"{f.short_filename}:{f.line}:{f.name}" for f in user_frames)
    where = _where(op, user_frames, rank.cwd)
    if kind == "cleanup" and not any(_is_cleanup(f) for f in user_frames):
        where += f" in {_cleanup_frame(frames)}()"  # AReaL's own teardown: name it
    if thread.name and thread.name != "MainThread":
        where += f" (thread {thread.name})"
    return Activity(kind, op, f"{op}|{sites}", where)


def _idle_cpu(rank: RankEvidence) -> bool:
    return rank.cpu_utilization is not None and rank.cpu_utilization < IDLE_CPU


def _is_cleanup(frame: Frame) -> bool:
    return bare(frame.name) in CLEANUP_NAMES or bool(CLEANUP_HINT.search(frame.name))


def _in_cleanup(frames: list[Frame]) -> bool:
    """Teardown in the user's code or in AReaL's (``PPOTrainer.close``, ``__exit__``,
    ``FSDPEngine.destroy``), or ``destroy_process_group`` anywhere."""
    return any(
        (_is_cleanup(f) and (not is_library(f) or is_areal(f.filename)))
        or f.name == "destroy_process_group"
        for f in frames
    )


def _cleanup_frame(frames: list[Frame]) -> str:
    """The innermost teardown call, for people (``FSDPEngine.destroy``)."""
    return next((f.name for f in frames if _is_cleanup(f)), "destroy_process_group")


def work_thread(rank: RankEvidence) -> ThreadStack | None:
    """The thread that carries the rank's distributed or rollout work, else the main thread.

    In AReaL's ``rpc_server`` the main thread only serves HTTP while FSDP and NCCL run in the
    ``EngineWorker`` thread; DeepSpeed issues all-gathers from the autograd thread. Preference:
    a thread anywhere in ``torch.distributed`` / c10d (a collective, P2P or rendezvous call, by
    its file: an HTTP client's ``send`` is none); then a thread in rollout work
    (``workflow_executor``, ``prepare_batch``, ``wait_results``); then the main thread, unless
    it only serves requests while another thread runs (py-spy's ``active`` flag): then that
    thread. Ties go to the main thread, then to the first thread listed. The watchdog's own
    threads (``areal-*``) are never chosen."""
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


_SERVE_LOOPS = frozenset({"serve_forever", "run_simple", "run_forever", "handle_request"})


def _work_score(thread: ThreadStack) -> int:
    """2: distributed work, 1: rollout work, 0: neither."""
    score = 0
    for frame in thread.frames:
        if is_distributed(frame):
            return 2
        if bare(frame.name) in ROLLOUT_CALLS or "workflow_executor" in frame.filename:
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
    return any(bare(f.name) in _SERVE_LOOPS for f in thread.frames)


def _exited_activity(rank: RankEvidence) -> Activity:
    info = rank.exit
    if info is None:
        return Activity("exited", "exited", "<exited>", "exited (no exit record)")
    if info.exc_type:
        site = _raise_site(info.traceback or "", rank.cwd)
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


def _raise_site(traceback_text: str, cwd: str | None) -> str:
    sites = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', traceback_text)
    user = [
        s
        for s in sites
        if not is_library_path(s[0]) and "runpy" not in s[0] and "areal_watchdog" not in s[0]
    ]
    if not user:
        return ""
    path, line, name = user[-1]
    return f"{display_path(path, cwd)}:{line} in {name}()"


def _blocking_op(frames: list[Frame], cpu_recent: float | None) -> tuple[str, str]:
    """The library call the rank is in and its kind, scanning from the innermost frame: the
    innermost torch.distributed operation, whatever wrappers of the user's call it."""
    for frame in frames:
        name = bare(frame.name)
        kind = _distributed_kind(frame)
        if kind is not None:
            return name, kind
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


def _distributed_kind(frame: Frame) -> str | None:
    """init, p2p or collective for a torch.distributed operation's frame, else None."""
    if not is_distributed(frame):
        return None
    name = bare(frame.name)
    for ops, kind in ((INIT_OPS, "init"), (P2P_OPS, "p2p"), (COLLECTIVE_OPS, "collective")):
        if name in ops:
            return kind
    return None


def _where(op: str, user_frames: list[Frame], cwd: str | None) -> str:
    if not user_frames:
        return op

    def call(frame: Frame) -> str:
        return frame.name if frame.name.startswith("<") else f"{frame.name}()"

    first = user_frames[0]
    callers = "".join(f" <- {call(f)}" for f in user_frames[1:4])
    more = " <- ..." if len(user_frames) > 4 else ""
    subject = "" if op == first.name else f"{op} "
    path = display_path(first.filename, cwd)
    return f"{subject}at {path}:{first.line} in {call(first)}{callers}{more}"
