"""When the leading sidecar acts: pure decisions from a plain snapshot of the job.

The sidecar loop gathers a ``Snapshot`` each poll (progress clock, live and gone ranks, peers'
exit records and silence, GPUs) and asks ``decide`` what to do; ``decide`` returns the actions
and the updated ``Reported`` state, and never looks at a file or a process. Each trigger is one
short rule below, in the order they are tried. The triggers themselves are named in
``evidence.trigger``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from areal_watchdog.diagnose.patterns.storage import BLOCKED_IN_KERNEL_S
from areal_watchdog.evidence.trigger import Trigger


class Say(str, Enum):
    """Terminal lines that are decisions too (said once per silence)."""

    SUSPECTED = "suspected"
    FINISHED = "finished"


@dataclass(frozen=True)
class Snapshot:
    """What the leader knows at one poll; plain values only."""

    now: float
    first_step_seen: bool
    silent_for: float  # seconds since the last progress
    threshold: float  # the stall threshold in force
    stalled: bool  # the progress clock says the threshold is crossed
    alive: frozenset[int]  # ranks alive on any node
    others_alive: int  # other processes of the job alive on any node (AReaL's controller...)
    gone: frozenset[int]  # ranks that ended on any node
    gone_clean: bool  # every one of them returned with code 0 by its own exit record
    gone_since: float | None  # when a rank was first seen gone while others lived
    crash_grace: float
    gpus_quiet_for: float  # every GPU idle or spinning for this long (0: unknown or busy)
    gpu_idle_timeout: float
    in_flight_over: float  # how far past its limit every rank's shared collective is (< 0: not)
    in_flight_op: str  # that collective's operation
    silent_nodes: tuple[str, ...]  # peers that stopped answering
    servers_refusing: tuple[str, ...]  # inference servers that answered once and now refuse
    server_awaited: str  # an inference server keeping a call waiting past its limit ("": none)
    in_kernel_for: float  # the longest any rank is blocked on a file, nothing moving (0: none)
    ended_nodes: int  # nodes whose job ended (exit record written)
    n_nodes: int  # nodes whose end is the job's end (AReaL on Slurm: the controller's host)
    silent_job_nodes: int  # of those, how many stopped answering
    failed: bool  # some node's job ended with a non-zero code
    ending_on_purpose: bool  # cancelled by the watchdog, or interrupted by the user


@dataclass(frozen=True)
class Reported:
    """What was already said or reported, so each event is reported once."""

    silence: bool = False  # this silence was reported (stall or GPU idle)
    failure: bool = False  # a crash, a silent node or a failed job was reported
    suspected: bool = False  # "stall suspected" was said for this silence


@dataclass(frozen=True)
class Action:
    """One thing for the loop to do: open an incident, say a line, or finish."""

    trigger: Trigger | None = None
    say: Say | None = None
    lost: tuple[str, ...] = ()
    op: str = ""  # the collective every rank waits in (``IN_FLIGHT``)
    servers: tuple[str, ...] = ()  # the servers that refuse connections (``SERVER_REFUSED``)
    awaited: str = ""  # what the awaited server keeps waiting (``SERVER_CALL``)


def decide(snap: Snapshot, reported: Reported) -> tuple[list[Action], Reported]:
    """The leader's actions for this poll, in order, and the new ``Reported`` state."""
    actions: list[Action] = []
    rules = (
        _node_silent, _job_ended, _rank_exited, _server_refused, _in_kernel, _gpu_idle,
        _in_flight, _server_call, _suspected, _stall,
    )  # fmt: skip
    for rule in rules:
        action, reported = rule(snap, reported)
        if action is not None:
            actions.append(action)
            if action.say is Say.FINISHED:
                break
    return actions, reported


def progressed(reported: Reported) -> Reported:
    """Progress ends a silence: the next one is reported afresh."""
    return replace(reported, silence=False, suspected=False)


Rule = tuple[Action | None, Reported]


def _node_silent(snap: Snapshot, reported: Reported) -> Rule:
    if not snap.silent_nodes or reported.failure or snap.ending_on_purpose:
        return None, reported
    action = Action(trigger=Trigger.NODE_SILENT, lost=snap.silent_nodes)
    return action, replace(reported, failure=True, silence=True)


def _job_ended(snap: Snapshot, reported: Reported) -> Rule:
    if snap.ended_nodes + snap.silent_job_nodes < snap.n_nodes:
        return None, reported
    if snap.failed and not snap.ending_on_purpose and not reported.failure:
        return Action(Trigger.JOB_FAILED, Say.FINISHED), replace(reported, failure=True)
    return Action(say=Say.FINISHED), reported


def _rank_exited(snap: Snapshot, reported: Reported) -> Rule:
    """A rank that failed or was killed while its peers live on. One that returned cleanly is
    done with its work (rank 0 of a finished job may still save while its peers have ended, or
    a peer may still join its threads): if that strands the others, the stall clock says so."""
    if snap.ending_on_purpose or reported.failure or not (snap.gone and snap.alive):
        return None, reported
    if snap.gone_clean:
        return None, reported
    if snap.gone_since is None or snap.now - snap.gone_since < snap.crash_grace:
        return None, reported
    return Action(trigger=Trigger.RANK_EXITED), replace(reported, failure=True)


def _server_refused(snap: Snapshot, reported: Reported) -> Rule:
    """An inference server that answered once refuses connections at the pulse: a fact at any
    moment (proof at the first look), never waiting for a threshold."""
    if snap.ending_on_purpose or reported.silence or reported.failure or not _running(snap):
        return None, reported
    if not snap.servers_refusing:
        return None, reported
    action = Action(trigger=Trigger.SERVER_REFUSED, servers=snap.servers_refusing)
    return action, replace(reported, silence=True)


def _in_kernel(snap: Snapshot, reported: Reported) -> Rule:
    """Ranks blocked in the kernel (D, or asleep in a file operation) with nothing moving for
    ``BLOCKED_IN_KERNEL_S``: a look now, warm-up or not (storage that stopped answering holds
    every step that reads it)."""
    if snap.ending_on_purpose or reported.silence or reported.failure or not _running(snap):
        return None, reported
    if snap.in_kernel_for < BLOCKED_IN_KERNEL_S:
        return None, reported
    return Action(trigger=Trigger.IN_KERNEL), replace(reported, silence=True)


def _gpu_idle(snap: Snapshot, reported: Reported) -> Rule:
    if snap.ending_on_purpose or reported.silence or not _running(snap):
        return None, reported
    if not snap.first_step_seen:  # GPUs idle while models load is no hang
        return None, reported
    if min(snap.gpus_quiet_for, snap.silent_for) < snap.gpu_idle_timeout:
        return None, reported
    return Action(trigger=Trigger.GPU_IDLE), replace(reported, silence=True)


def _in_flight(snap: Snapshot, reported: Reported) -> Rule:
    """The sensor between looks: every rank waits in one collective past what it ever took,
    nothing at work. A look now, before the threshold (a failure reported first wins)."""
    if snap.ending_on_purpose or reported.silence or reported.failure or not _running(snap):
        return None, reported
    if not snap.first_step_seen or snap.stalled or snap.in_flight_over < 0:
        return None, reported
    action = Action(trigger=Trigger.IN_FLIGHT, op=snap.in_flight_op)
    return action, replace(reported, silence=True)


def _server_call(snap: Snapshot, reported: Reported) -> Rule:
    """The rollout side's sensor: one inference server keeps a call of the job waiting far
    longer than the same call took elsewhere or before (a weight update it never answers). A
    look now, warm-up or not; the look's evidence decides."""
    if snap.ending_on_purpose or reported.silence or reported.failure or not _running(snap):
        return None, reported
    if not snap.first_step_seen or snap.stalled or not snap.server_awaited:
        return None, reported
    action = Action(trigger=Trigger.SERVER_CALL, awaited=snap.server_awaited)
    return action, replace(reported, silence=True)


def _suspected(snap: Snapshot, reported: Reported) -> Rule:
    if snap.ending_on_purpose or reported.silence or reported.suspected or not _running(snap):
        return None, reported
    if reported.failure:  # the job failed or lost a part: that was reported, not a stall
        return None, reported
    if snap.silent_for <= snap.threshold * 2 / 3:
        return None, reported
    return Action(say=Say.SUSPECTED), replace(reported, suspected=True)


def _stall(snap: Snapshot, reported: Reported) -> Rule:
    if snap.ending_on_purpose or reported.silence or not _running(snap):
        return None, reported
    if not snap.stalled:
        return None, reported
    return Action(trigger=Trigger.STALL), replace(reported, silence=True)


def _running(snap: Snapshot) -> bool:
    """Something of the job still runs that a silence can be blamed on: a rank, or (AReaL's
    single controller) another process of the job. Or nothing yet: no rank ever started, and
    the job has not ended. A job stuck before its ranks (torchrun at a rendezvous that a node
    never joins, a container that never starts) is a silence too, seen at ``startup_timeout``."""
    return bool(snap.alive) or snap.others_alive > 0 or not (snap.gone or snap.first_step_seen)
