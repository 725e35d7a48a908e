"""A hang's timeline as plain data (``timeline.json``): what the picture draws and what tests
read. Pure: a report, the sidecar's short history and the earlier looks of the same silence in,
one dict out.

Times are seconds from the last step (negative before it). Rows are the ranks, by node, and past
``RANK_ROWS`` ranks the stack groups (identical behaviour) with the culprits apart; lanes are the
GPUs of the leader's node (utilisation, power) and the inference servers the looks probed."""

from __future__ import annotations

from typing import Any

from areal_watchdog.common.rankset import format_ranks
from areal_watchdog.report.build import stamp
from areal_watchdog.rundir.progress.history import History

RANK_ROWS = 64  # more ranks than this: a row per group of ranks that behave alike
STEPS_SHOWN = 20  # step ends drawn before the stall


def timeline(report: dict[str, Any], history: History, earlier: list[dict[str, Any]]) -> dict:
    """The picture's data; ``earlier``: the suspected looks written at this silence."""
    origin = _origin(report, history)
    looks = _looks(report, earlier)
    steps = [{"t": round(t - origin, 3), "step": s} for t, s in list(history.steps)[-STEPS_SHOWN:]]
    end = max([0.0, *(look["t"] for look in looks)]) + 1.0
    start = min([-5.0, *(s["t"] for s in steps)])
    return {
        "origin": origin,
        "start": round(start, 3),
        "end": round(end, 3),
        "last_step": report.get("last_step"),
        "since": "last step" if report.get("last_progress_at") else "start",
        "stall": {"from": 0.0, "to": round(_stalled(report) or 0.0, 3)},
        "threshold_s": report.get("stall_threshold_s"),
        "category": report.get("category"),
        "culprit_ranks": list(report.get("culprit_ranks") or []),
        "steps": steps,
        "looks": looks,
        "rows": _rows(report),
        "lanes": _gpu_lanes(history, origin, start) + _server_lanes(report, earlier, origin),
    }


def _origin(report: dict[str, Any], history: History) -> float:
    """When the last step was seen (the report's ``last_progress_at``); with no step yet, about
    the start (the look's time less its silence); else the history's last step."""
    last = stamp(report.get("last_progress_at"))
    if last is not None:
        return last
    detected = stamp(report.get("detected_at"))
    if detected is not None:
        return detected - (_stalled(report) or 0.0)
    return history.steps[-1][0] if history.steps else 0.0


def _looks(report: dict[str, Any], earlier: list[dict[str, Any]]) -> list[dict]:
    """Each look at this silence and what it decided, oldest first."""
    looks = [
        {"t": round(_stalled(r), 3), "kind": "suspected", "category": r.get("category")}
        for r in earlier
        if _stalled(r) is not None and r.get("last_step") == report.get("last_step")
    ]
    first = _stalled(report) or 0.0
    confirmation = (
        report.get("confirmation") if isinstance(report.get("confirmation"), dict) else {}
    )
    by = confirmation.get("by")
    after = _number(confirmation.get("after_s")) or 0.0
    category = report.get("category")
    if by == "hard_limit":
        limit = _number(confirmation.get("cancel_after_s")) or first
        looks.append({"t": round(limit, 3), "kind": "hard limit", "category": category})
    elif by == "second_look":
        looks.append({"t": round(first, 3), "kind": "first look", "category": category})
        looks.append({"t": round(first + after, 3), "kind": "second look", "category": category})
    else:  # proof at the first look, or a report with no confirmation (a crash, a lost node)
        looks.append({"t": round(first, 3), "kind": "proof", "category": category})
    return sorted(looks, key=lambda look: look["t"])


def _stalled(report: dict[str, Any]) -> float | None:
    """How long the look's silence was: with no step yet, the start-up limit it crossed."""
    stalled = _number(report.get("stalled_for_s"))
    if stalled is None and report.get("last_progress_at") is None:
        return _number(report.get("stall_threshold_s"))
    return stalled


def _rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The ranks' rows, then a row per other process of the job (AReaL's workers, servers)."""
    return _rank_rows(report) + _worker_rows(report)


def _culprit_pids(report: dict[str, Any]) -> set[int]:
    named = report.get("culprit_workers") or []
    return {w["pid"] for w in named if isinstance(w, dict) and isinstance(w.get("pid"), int)}


def _rank_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """A row per rank (by node), or per group of alike ranks past ``RANK_ROWS``; a rank is a
    culprit by its rank, or by its process (AReaL's named workers)."""
    culprits = set(report.get("culprit_ranks") or [])
    pids = _culprit_pids(report)
    ranks = [r for r in report.get("ranks") or [] if isinstance(r, dict)]
    if len(ranks) <= RANK_ROWS and ranks:
        ordered = sorted(ranks, key=lambda r: (str(r.get("node")), r.get("rank") or 0))
        return [
            {
                "label": _rank_label(r),
                "node": r.get("node"),
                "ranks": [r.get("rank")],
                "state": r.get("state"),
                "where": r.get("where") or "",
                "culprit": r.get("rank") in culprits or r.get("pid") in pids,
            }
            for r in ordered
        ]
    rows = []
    for group in report.get("groups") or []:
        members = [r for r in group.get("ranks") or [] if isinstance(r, int)]
        for part, culprit in ((sorted(set(members) & culprits), True),
                              (sorted(set(members) - culprits), False)):  # fmt: skip
            if part:
                rows.append({"label": _ranks_label(part), "node": None, "ranks": part,
                             "state": group.get("kind"), "where": group.get("where") or "",
                             "culprit": culprit})  # fmt: skip
    return rows


def _worker_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """AReaL's other processes (a rollout worker, an inference server), culprits by pid."""
    culprits = _culprit_pids(report)
    rows = []
    for worker in [w for w in report.get("workers") or [] if isinstance(w, dict)][:RANK_ROWS]:
        where = worker.get("address") or worker.get("index")
        role = worker.get("role") or "process"
        culprit = worker.get("pid") in culprits
        rows.append({"label": role if where is None else f"{role} {where}",
                     "node": worker.get("node"), "ranks": [], "state": worker.get("state"),
                     "where": worker.get("where") or "", "culprit": culprit})  # fmt: skip
    return rows


def _rank_label(rank: dict[str, Any]) -> str:
    role = rank.get("role")
    return f"rank {rank.get('rank')}" + (f" ({role})" if role and role != "rank" else "")


def _ranks_label(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def _gpu_lanes(history: History, origin: float, start: float) -> list[dict[str, Any]]:
    """The job's GPUs at work (all nodes), then each GPU of this node: utilisation and power,
    from the window's start on."""
    lanes: dict[tuple[int, str], list[list[float]]] = {}
    for t, points in history.gpus:
        at = round(t - origin, 3)
        for index, utilization, power, _limit in points if at >= start else ():
            lanes.setdefault((index, "utilization %"), []).append([at, utilization])
            if power is not None:
                lanes.setdefault((index, "power W"), []).append([at, power])
    node = history.node or "this node"
    own = [
        {
            "name": f"GPU {index} ({node}) {what}",
            "kind": "gpu",
            "unit": what.split()[-1],
            "points": points,
        }  # fmt: skip
        for (index, what), points in sorted(lanes.items())
    ]
    return _job_gpu_lane(history, origin, start) + own + _node_lanes(history, origin, start)


def _node_lanes(history: History, origin: float, start: float) -> list[dict[str, Any]]:
    """Each other node's GPUs (mean utilisation, total power), as its status said each poll."""
    lanes = []
    for node, samples in sorted(history.nodes.items()):
        if node == history.node and history.gpus:
            continue  # drawn GPU by GPU above
        shown = [(round(t - origin, 3), u, p) for t, u, p in samples if t - origin >= start]
        for what, column in (("utilization %", 1), ("power W", 2)):
            lanes.append({"name": f"node {node} GPUs {what}", "kind": "gpu",
                          "unit": what.split()[-1],
                          "points": [[s[0], s[column]] for s in shown]})  # fmt: skip
    return lanes


def _job_gpu_lane(history: History, origin: float, start: float) -> list[dict[str, Any]]:
    points = [[round(t - origin, 3), float(w)] for t, w, _n in history.job_gpus]
    points = [p for p in points if p[0] >= start]
    if not points:
        return []
    every = max(n for _t, _w, n in history.job_gpus)
    name = f"GPUs working, all nodes (of {every})"
    return [{"name": name, "kind": "gpu", "unit": "GPUs", "points": points}]


def _server_lanes(
    report: dict[str, Any], earlier: list[dict[str, Any]], origin: float
) -> list[dict[str, Any]]:
    """Each inference server's throughput and queue, as each look probed it."""
    lanes: dict[tuple[str, str], list[list[float]]] = {}
    for look in [*earlier, report]:
        at = _stalled(look)
        for server in look.get("servers") or []:
            if at is None or not isinstance(server, dict):
                continue
            for key, what in (("gen_throughput", "tokens/s"), ("queued", "queued")):
                value = _number(server.get(key))
                if value is not None:
                    lanes.setdefault((str(server.get("address")), what), []).append([at, value])
    return [
        {
            "name": f"server {address} {what}",
            "kind": "server",
            "unit": what,
            "points": sorted(points),
        }  # fmt: skip
        for (address, what), points in sorted(lanes.items())
    ]


def _number(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None
