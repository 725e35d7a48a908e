"""Why evidence was gathered: the trigger a report names (``report.json``'s ``trigger``).

Triggers are not categories: a trigger says why the watchdog looked (``node_silent``: a peer
sidecar stopped answering), the classifier's category says what it found (``node_lost``). The
sidecar decides when one fires (``watch.silence.triggers``); the report and its readers only name
it.
"""

from __future__ import annotations

from enum import Enum


class Trigger(str, Enum):
    """Why an incident was opened (``report.json``'s ``trigger``)."""

    STALL = "stall"  # no progress for longer than the threshold
    GPU_IDLE = "gpu_idle"  # every GPU idle or spinning, and no progress
    IN_FLIGHT = "collective_in_flight"  # all but a few ranks wait in one collective
    SERVER_REFUSED = "server_refused"  # an inference server that answered refuses connections
    SERVER_CALL = "server_call_awaited"  # one server keeps a call waiting that others answered
    IN_KERNEL = "blocked_in_kernel"  # ranks in state D with no data moving (storage, mostly)
    RANK_EXITED = "rank_exited"  # a rank ended while others live on
    NODE_SILENT = "node_silent"  # a peer sidecar stopped answering
    JOB_FAILED = "job_failed"  # every node's job ended, some with a non-zero code


# One report per silence.
SILENCES = (
    Trigger.STALL,
    Trigger.GPU_IDLE,
    Trigger.IN_FLIGHT,
    Trigger.SERVER_REFUSED,
    Trigger.SERVER_CALL,
    Trigger.IN_KERNEL,
)
