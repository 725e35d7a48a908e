"""Write one incident directory: evidence, stacks and log tails first, the report last, so a
report.json on disk means the incident is complete. Secrets are scrubbed here, once, from
everything written (the report handed in is scrubbed already)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import write_json_atomic, write_text_atomic
from areal_watchdog.common.redact import Redactor
from areal_watchdog.evidence.model import Evidence, RankEvidence
from areal_watchdog.report.markdown import render_markdown


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
        stacks = redactor.scrub(_stack_text(rank))
        write_text_atomic(incident_dir / "stacks" / f"rank_{rank.rank}.txt", stacks)
        tail = rank.log_tail or ""
        if rank.exit is not None and rank.exit.traceback:
            tail = f"{tail}\n--- traceback ---\n{rank.exit.traceback}"
        if tail.strip():
            write_text_atomic(incident_dir / "logs" / f"rank_{rank.rank}.txt", redactor.scrub(tail))
    write_text_atomic(incident_dir / "report.md", render_markdown(report))
    write_json_atomic(incident_dir / "report.json", report, fsync=True)
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
