"""The incident report: ``report.json`` (the versioned contract), ``report.md`` and raw evidence.

Layout of one incident: ``<run_dir>/incidents/<incident_id>/`` with ``report.json``,
``report.md``, ``evidence.json`` (everything gathered, replayable into the classifier),
``stacks/rank_<r>.txt`` and ``logs/rank_<r>.txt``. The schema is ``schema.json`` beside
this module and is documented in ``docs/report-schema.md``.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import write_json_atomic, write_text_atomic
from areal_watchdog.common.rankset import format_ranks
from areal_watchdog.common.redact import Redactor
from areal_watchdog.diagnose.classify import Verdict, describe
from areal_watchdog.evidence.model import EXITED, Evidence, RankEvidence

SCHEMA_VERSION = 1
SERVER_FIELDS = ("address", "state", "health_s", "running", "queued", "gen_throughput", "paused")
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
    trigger: str = "stall"  # stall | job_failed | rank_exited | node_lost
    action: str = "report"  # report | cancel
    trajectory: dict[str, Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds spent per phase


def new_incident_id(category: str, now: float | None = None) -> str:
    """A sortable, unique id: ``20261122T031500Z-collective_mismatch-3f9a``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now or time.time()))
    return f"{stamp}-{category}-{secrets.token_hex(2)}"


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds")


def build_report(
    incident_id: str, verdict: Verdict, evidence: Evidence, ctx: IncidentContext
) -> dict[str, Any]:
    """The report.json document."""
    incident_dir = Path(ctx.run_dir) / "incidents" / incident_id
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
        "trigger": ctx.trigger,
        "action": ctx.action,
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
        "ranks": [_rank_entry(r) for r in evidence.ranks],
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


def _rank_entry(rank: RankEvidence) -> dict[str, Any]:
    thread = rank.main_thread()
    activity = describe(rank)
    entry: dict[str, Any] = {
        "rank": rank.rank,
        "node": rank.node,
        "pid": rank.pid,
        "state": rank.state,
        "evidence_method": rank.evidence_method,
        "where": activity.where,
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
    return entry


def write_incident(
    run_dir: Path, report: dict[str, Any], evidence: Evidence, redactor: Redactor
) -> Path:
    """Write the incident directory; the report goes last so its presence means "complete"."""
    incident_dir = run_dir / "incidents" / report["incident_id"]
    (incident_dir / "stacks").mkdir(parents=True, exist_ok=True)
    (incident_dir / "logs").mkdir(exist_ok=True)
    clean_evidence = redactor.scrub_tree(evidence.to_dict())
    write_json_atomic(incident_dir / "evidence.json", clean_evidence)
    for rank in evidence.ranks:
        write_text_atomic(incident_dir / "stacks" / f"rank_{rank.rank}.txt", _stack_text(rank))
        tail = rank.log_tail or ""
        if rank.exit is not None and rank.exit.traceback:
            tail = f"{tail}\n--- traceback ---\n{rank.exit.traceback}"
        if tail.strip():
            write_text_atomic(incident_dir / "logs" / f"rank_{rank.rank}.txt", redactor.scrub(tail))
    clean = redactor.scrub_tree(report)
    write_text_atomic(incident_dir / "report.md", render_markdown(clean))
    write_json_atomic(incident_dir / "report.json", clean, fsync=True)
    return incident_dir


def _stack_text(rank: RankEvidence) -> str:
    lines = [
        f"rank {rank.rank} pid {rank.pid} node {rank.node} state {rank.state} "
        f"via {rank.evidence_method}"
    ]
    if rank.error:
        lines.append(f"error: {rank.error}")
    for thread in rank.threads:
        lines.append(f"\nThread {thread.name or '?'} (most recent call first):")
        lines.extend(f'  File "{f.filename}", line {f.line}, in {f.name}' for f in thread.frames)
    return "\n".join(lines) + "\n"


def _worker_lines(report: dict[str, Any]) -> list[str]:
    """The cause and the culprits that are not ranks (inference servers, AReaL workers)."""
    lines = [f"- Cause: `{report['cause']}`"] if report.get("cause") else []
    workers = [
        " ".join(str(w[k]) for k in ("role", "index", "address", "node", "pid") if w.get(k))
        + (f" ({w['state']})" if w.get("state") else "")
        for w in report.get("culprit_workers") or []
    ]
    if workers:
        lines.append(f"- Culprit workers: {'; '.join(workers)}")
    return lines


def _server_lines(report: dict[str, Any]) -> list[str]:
    servers = report.get("servers") or []
    if not servers:
        return []
    lines = ["", "## Inference servers", "", "| " + " | ".join(SERVER_FIELDS) + " |"]
    lines.append("|" + "---|" * len(SERVER_FIELDS))
    for server in servers:
        cells = ["-" if server.get(k) is None else str(server[k]) for k in SERVER_FIELDS]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    """A report a person reads first: verdict, groups, ranks, then where the files are."""
    job = report["job"]
    culprits = format_ranks(report["culprit_ranks"]) or "none named"
    lines = [
        f"# Hang report: `{report['category']}`",
        "",
        f"**{report['summary']}**",
        "",
        f"- Culprit ranks: {culprits}; nodes: {', '.join(report['culprit_nodes']) or '-'}",
        *_worker_lines(report),
        f"- Confidence: {report['confidence']}",
        f"- Job: {job['experiment_name']}/{job['trial_name']} ({job['backend']}"
        f"{', job ' + str(job['job_id']) if job['job_id'] else ''}), world size "
        f"{job['world_size']}, nodes {', '.join(job['nodes'])}",
        f"- Detected: {report['detected_at']} ({report['trigger']}); last progress "
        f"{report['last_progress_at'] or 'never'}; last step {report['last_step']}",
        f"- Action: {report['action']}",
        "",
        "## Stack groups",
        "",
        "| ranks | kind | where |",
        "|---|---|---|",
    ]
    for group in report["groups"]:
        lines.append(f"| {format_ranks(group['ranks'])} | {group['kind']} | `{group['where']}` |")
    lines += [
        "",
        "## Ranks",
        "",
        "| rank | node | pid | state | via | where |",
        "|---|---|---|---|---|---|",
    ]
    for rank in report["ranks"]:
        state = rank["state"]
        if "exit_code" in rank:
            state += f" ({rank['exit_code']})"
        lines.append(
            f"| {rank['rank']} | {rank['node']} | {rank['pid']} | {state} | "
            f"{rank['evidence_method']} | `{rank['where']}` |"
        )
    if report.get("unanswered_nodes"):
        lines += ["", f"Nodes that did not answer: {', '.join(report['unanswered_nodes'])}"]
    lines += _server_lines(report)
    collectives = report.get("collectives")
    if collectives:
        lines += ["", "## Collectives (Flight Recorder)", ""]
        for group in collectives["groups"]:
            lines.append(f"- group {group['group']}: {'; '.join(group['table'])}")
            if group["kind"] in ("mismatch", "missing"):
                lines.append(f"  - {group['description']}")
        if collectives.get("ranks_without_trace"):
            lines.append(
                f"- no trace from ranks {format_ranks(collectives['ranks_without_trace'])}"
            )
        lines.append(f"- {collectives['agreement']}")
    trajectory = report.get("trajectory")
    if trajectory:
        lines += [
            "",
            "## Replay",
            "",
            f"Last dumped step: {trajectory.get('step')}",
            "",
            f"```\n{trajectory.get('replay_command')}\n```",
        ]
    files = report["files"]
    lines += [
        "",
        "## Files",
        "",
        f"- Stacks: `{files['stacks_dir']}`",
        f"- Log tails: `{files['logs_dir']}`",
        f"- Raw evidence: `{files['evidence']}`",
        "",
    ]
    return "\n".join(lines)


def load_schema() -> dict[str, Any]:
    """The JSON Schema every report.json validates against."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
