"""The incident report: ``report.json`` (the versioned contract), ``report.md`` and raw evidence.

Layout of one incident: ``<run_dir>/incidents/<incident_id>/`` with ``report.json``,
``report.md``, ``evidence.json`` (everything gathered, replayable into the classifier),
``stacks/rank_<r>.txt`` and ``logs/rank_<r>.txt`` (``<role>_<index>_pid<pid>.txt`` for the
parts of an AReaL job that are not ranks). The schema is ``schema.json`` beside
this module, with the hang kinds' names from ``diagnose/kinds.py`` (``load_schema``), and is
documented in ``docs/report-schema.md``.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from areal_watchdog.config.model import HangAction
from areal_watchdog.diagnose.kinds import CATEGORIES, CAUSES
from areal_watchdog.diagnose.one_process.activity import work_thread
from areal_watchdog.diagnose.verdict import Activity, Verdict
from areal_watchdog.evidence.model import EXITED, Evidence, RankEvidence
from areal_watchdog.evidence.trigger import Trigger

SCHEMA_VERSION = 4
SERVER_FIELDS = (
    "address", "state", "engine", "health_s", "running", "queued", "gen_throughput", "paused",
    "updating_weights",
)  # fmt: skip
SCHEMA_PATH = Path(__file__).with_name("schema.json")


@dataclass
class IncidentContext:
    """What the sidecar knows about the job and the stall, beside the evidence."""

    backend: str
    run_id: str
    run_dir: str
    world_size: int
    nodes: list[str]
    experiment_name: str = ""
    trial_name: str = ""
    job_id: str | None = None
    detected_at: float = field(default_factory=time.time)
    last_progress_at: float | None = None
    threshold_s: float | None = None
    last_step: int | None = None
    trigger: Trigger | str = Trigger.STALL  # a Trigger or its value; anything else is refused
    action: HangAction = HangAction.REPORT
    trajectory: dict[str, Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds spent per phase
    folder: str = "incidents"  # its folder in the run directory (``suspected``: not posted)


def new_incident_id(category: str, now: float | None = None) -> str:
    """A sortable, unique id: ``20261122T031500Z-collective_mismatch-3f9a``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now or time.time()))
    return f"{stamp}-{category}-{secrets.token_hex(2)}"


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds")


def stamp(value: object) -> float | None:
    """A report's ISO time as Unix seconds (``iso``'s inverse); None for anything else."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def build_report(
    incident_id: str, verdict: Verdict, evidence: Evidence, ctx: IncidentContext
) -> dict[str, Any]:
    """The report.json document."""
    incident_dir = Path(ctx.run_dir) / ctx.folder / incident_id
    silent = None if ctx.last_progress_at is None else ctx.detected_at - ctx.last_progress_at
    return {
        "schema_version": SCHEMA_VERSION,
        "incident_id": incident_id,
        "category": verdict.category,
        "confidence": round(verdict.confidence, 2),
        "culprit_ranks": verdict.culprit_ranks,
        "culprit_nodes": verdict.culprit_nodes,
        "culprit_workers": verdict.culprit_workers,
        "cause": verdict.cause,
        "summary": verdict.summary,
        "trigger": Trigger(ctx.trigger).value,
        "action": HangAction(ctx.action).value,
        "detected_at": iso(ctx.detected_at),
        "last_progress_at": iso(ctx.last_progress_at),
        "stalled_for_s": None if silent is None else round(silent, 3),
        "stall_threshold_s": ctx.threshold_s,
        "last_step": ctx.last_step,
        "job": {
            "backend": ctx.backend,
            "job_id": ctx.job_id,
            "run_id": ctx.run_id,
            "experiment_name": ctx.experiment_name,
            "trial_name": ctx.trial_name,
            "nodes": ctx.nodes,
            "world_size": ctx.world_size,
            "run_dir": ctx.run_dir,
        },
        "ranks": [_rank_entry(r, verdict.activities.get(r.rank)) for r in evidence.ranks],
        "workers": [
            _rank_entry(w, verdict.worker_activities.get(w.pid or 0)) for w in evidence.workers
        ],
        "groups": [
            {"signature": g.signature, "where": g.where, "kind": g.kind, "ranks": g.ranks}
            for g in verdict.groups
        ],
        "unanswered_nodes": evidence.unanswered_nodes,
        "collectives": verdict.collectives,
        "servers": [{k: s.get(k) for k in SERVER_FIELDS} for s in evidence.servers],
        "trajectory": ctx.trajectory,
        "timings": ctx.timings,
        "files": {
            "incident_dir": str(incident_dir),
            "report_md": str(incident_dir / "report.md"),
            "evidence": str(incident_dir / "evidence.json"),
            "stacks_dir": str(incident_dir / "stacks"),
            "logs_dir": str(incident_dir / "logs"),
        },
    }


def _rank_entry(rank: RankEvidence, activity: Activity | None) -> dict[str, Any]:
    """One process as the classifier saw it: the thread it judged and where that thread waits;
    AReaL's role and worker index where known."""
    thread = work_thread(rank)
    entry: dict[str, Any] = {
        "rank": rank.rank,
        **{k: v for k, v in _identity(rank).items() if v is not None},
        "node": rank.node,
        "pid": rank.pid,
        "state": rank.state,
        "evidence_method": rank.evidence_method,
        "where": activity.where if activity else "",
        "thread": thread.name if thread else None,
        "frames": [
            {"name": f.name, "file": f.filename, "line": f.line}
            for f in (thread.frames if thread else [])
        ],
    }
    if rank.state == EXITED and rank.exit is not None:
        entry["exit_code"] = rank.exit.code
        entry["exit_kind"] = rank.exit.kind
        if rank.exit.exc_type:
            entry["exception"] = f"{rank.exit.exc_type}: {rank.exit.message or ''}".strip()
    if rank.error:
        entry["error"] = rank.error
    if rank.process_status:
        entry["process_status"] = rank.process_status
    if rank.gpu:
        entry["gpu"] = rank.gpu
    if rank.cpu_utilization is not None:
        entry["cpu_utilization"] = round(rank.cpu_utilization, 3)
    if rank.kernel_waits:
        entry["kernel_waits"] = rank.kernel_waits
    if rank.children:
        entry["children"] = rank.children
    return entry


def _identity(process: RankEvidence) -> dict[str, Any]:
    return {
        "role": process.role,
        "index": process.worker_index,
        "address": process.address,
        "pending_tasks": len(process.tasks) if process.tasks else None,
    }


def load_schema() -> dict[str, Any]:
    """The JSON Schema every report.json validates against. The category and cause enums come
    from the table of hang kinds, so that a new kind is declared in one place."""
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    properties = schema["properties"]
    properties["category"]["enum"] = [k.name for k in CATEGORIES]
    properties["cause"]["enum"] = [None, *(k.name for k in CAUSES)]
    return schema
