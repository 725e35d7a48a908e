"""One node of ``bench_netfs``, on a network filesystem client of its own: the real
``Coordinator`` as a leader (publishes its status, asks for evidence now and then, collects the
answer) or as a follower (reads the leader's status every ``--look`` seconds, answers each
request at once). Every event goes to a JSON-lines log, stamped with this machine's one clock.

    python netfs_probe.py leader|follower RUN_DIR LOG SECONDS
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from areal_watchdog.rundir.layout import RunLayout  # noqa: E402
from areal_watchdog.watch.cluster.coordination import Coordinator  # noqa: E402

NODES = ["n0", "n1"]
NODE_TIMEOUT = 3.0  # a status every second
LOOK = 0.05  # seconds between two reads of the leader's status, for a fine measure
ASK_EVERY = 2.7  # seconds between two requests (out of step with the statuses)


def leader(coordinator: Coordinator, log: list[dict], seconds: float) -> None:
    """Publish when due; ask, and wait for the answer, every ``ASK_EVERY`` seconds."""
    end, next_ask = time.time() + seconds, time.time() + ASK_EVERY
    while time.time() < end:
        if coordinator.publish({"state": "watching"}):  # renamed into place by now
            log.append({"published": coordinator.seq, "at": time.time()})
        if time.time() >= next_ask:
            request = coordinator.request_evidence("bench")
            log.append({"published": coordinator.seq, "at": time.time()})
            log.append({"asked": request, "at": time.time()})
            got = coordinator.collect(request, ["n1"], timeout=10.0)
            log.append({"collected": request, "at": time.time(), "answered": bool(got)})
            next_ask = time.time() + ASK_EVERY
        time.sleep(LOOK)


def follower(coordinator: Coordinator, log: list[dict], seconds: float) -> None:
    """Read the leader's status every ``LOOK`` seconds (``refresh``: a status never seen is
    looked for in its folder's listing first); answer a new request at once."""
    end, answered = time.time() + seconds, None
    while time.time() < end:
        began = time.time()
        coordinator.refresh(closely=True)  # as a follower reads its leader around a stall
        now = time.time()
        seq = (coordinator.statuses.get("n0") or {}).get("seq")
        log.append({"read": seq, "began": began, "at": now})
        request = (coordinator.current_request() or {}).get("id")
        if request and request != answered:
            coordinator.answer(request, {"ranks": {}})
            log.append({"saw": request, "at": now, "answered_at": time.time()})
            answered = request
        time.sleep(LOOK)


def main() -> int:
    role, run_dir, out, seconds = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    node = "n0" if role == "leader" else "n1"
    coordinator = Coordinator(RunLayout(run_dir), "bench", node, list(NODES), NODE_TIMEOUT)
    log: list[dict] = []
    (leader if role == "leader" else follower)(coordinator, log, float(seconds))
    out.write_text("\n".join(json.dumps(e) for e in log) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
