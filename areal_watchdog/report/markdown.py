"""report.md: the report a person reads first (verdict, groups, ranks, servers, collectives,
replay, files), rendered from report.json alone."""

from __future__ import annotations

from typing import Any

from areal_watchdog.common.rankset import format_ranks, worker_label
from areal_watchdog.diagnose.render import collective_lines
from areal_watchdog.evidence.kernel_readings.kernel_wait import KernelWait
from areal_watchdog.report.build import SERVER_FIELDS


def _worker_lines(report: dict[str, Any]) -> list[str]:
    """The cause and the culprits that are not ranks (inference servers, AReaL workers)."""
    lines = [f"- Cause: `{report['cause']}`"] if report.get("cause") else []
    workers = [worker_label(w) for w in report.get("culprit_workers") or []]
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
    sections = (_header, _timeline, _groups, _ranks, _waits, _workers, _server_lines,
                _collectives, _replay, _files)  # fmt: skip
    return "\n".join(line for section in sections for line in section(report)) + "\n"


TIMELINE_PENDING = (
    "Timeline: being drawn, after the report was posted (`timeline.svg`, `timeline.png`, and its "
    "data in `timeline.json`, beside this file)."
)


def _timeline(report: dict[str, Any]) -> list[str]:
    """Where the picture goes: ``report/picture.py`` replaces the line once it is drawn (a
    look nobody was paged for gets none)."""
    confirmation = report.get("confirmation")
    if isinstance(confirmation, dict) and confirmation.get("posted") is False:
        return []
    return ["", "## Timeline", "", TIMELINE_PENDING]


def _header(report: dict[str, Any]) -> list[str]:
    job = report["job"]
    culprits = format_ranks(report["culprit_ranks"]) or "none named"
    job_id = f", job {job['job_id']}" if job["job_id"] else ""
    return [
        f"# Hang report: `{report['category']}`",
        "",
        f"**{report['summary']}**",
        "",
        f"- Culprit ranks: {culprits}; nodes: {', '.join(report['culprit_nodes']) or '-'}",
        *_worker_lines(report),
        f"- Confidence: {report['confidence']}",
        f"- Job: {job['experiment_name']}/{job['trial_name']} ({job['backend']}{job_id}), "
        f"world size {job['world_size']}, nodes {', '.join(job['nodes'])}",
        f"- Detected: {report['detected_at']} ({report['trigger']}); last progress "
        f"{report['last_progress_at'] or 'never'}; last step "
        f"{'none yet' if report['last_step'] is None else report['last_step']}",
        f"- Action: {report['action']}",
    ]


def _groups(report: dict[str, Any]) -> list[str]:
    lines = ["", "## Stack groups", "", "| ranks | kind | where |", "|---|---|---|"]
    for group in report["groups"]:
        lines.append(f"| {format_ranks(group['ranks'])} | {group['kind']} | `{group['where']}` |")
    return lines


def _ranks(report: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Ranks",
        "",
        "| rank | node | pid | state | via | thread | where |",
        "|---|---|---|---|---|---|---|",
    ]
    for rank in report["ranks"]:
        state = rank["state"] + (f" ({rank['exit_code']})" if "exit_code" in rank else "")
        role = (
            f" ({rank['role']} {rank.get('index', '')})".replace(" )", ")")
            if "role" in rank
            else ""
        )
        lines.append(
            f"| {rank['rank']}{role} | {rank['node']} | {rank['pid']} | {state} | "
            f"{rank['evidence_method']} | {rank.get('thread') or '-'} | `{rank['where']}` |"
        )
    if report.get("ranks_total"):
        lines += ["", f"{len(report['ranks'])} of {report['ranks_total']} ranks shown (culprits, "
                  "the first of every stack group, the exited); every rank of a node is in "
                  f"`{report['files']['ranks_by_node']}`"]  # fmt: skip
    if report.get("unanswered_nodes"):
        lines += ["", f"Nodes that did not answer: {', '.join(report['unanswered_nodes'])}"]
    return lines


def _waits(report: dict[str, Any]) -> list[str]:
    """What the blocked processes wait on in the kernel, and the children they started."""
    lines = []
    for process in [*report["ranks"], *(report.get("workers") or [])]:
        who = f"rank {process['rank']}" if process.get("rank") is not None else (
            f"{process.get('role', 'process')} {process.get('index', '')}".strip())  # fmt: skip
        waits = process.get("kernel_waits") or []
        if waits and (waits[0]["state"] == "D" or waits[0]["path"] or len(waits) > 1):
            lines += [f"- {who} (pid {process['pid']}): {wait_phrase(w)}" for w in waits[:4]]
        waiting = bool(waits) and waits[0]["syscall"] in ("wait4", "waitid")
        for child in process.get("children") or []:
            if not (waiting or child["state"] == "D" or child.get("cpu_utilization", 0) >= 0.3):
                continue  # an idle DataLoader worker is not what anything waits on
            where = child["frames"][0] if child["frames"] else None
            at = f", at {where['name']} ({where['file']}:{where['line']})" if where else ""
            wait = child.get("kernel_wait")
            lines.append(
                f"- {who} (pid {process['pid']}) started pid {child['pid']}: `{child['command']}`"
                f"{', ' + wait_phrase(wait) if wait else ''}{at}"
            )
    return ["", "## What the processes wait on", "", *lines] if lines else []


def wait_phrase(wait: dict[str, Any]) -> str:
    """``D (uninterruptible) in read() on /mnt/x (fuse, mounted at /mnt)``, from a report."""
    return KernelWait.from_dict(wait).phrase()


def _workers(report: dict[str, Any]) -> list[str]:
    """The parts of an AReaL job that are not ranks: what each was doing."""
    workers = report.get("workers") or []
    if not workers:
        return []
    lines = [
        "",
        "## Other processes of the job",
        "",
        "| role | index | node | pid | state | tasks | thread | where |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w in workers:
        index = w.get("index", w.get("address", "-"))
        lines.append(
            f"| {w.get('role', '-')} | {index} | {w['node']} | {w['pid']} | {w['state']} | "
            f"{w.get('pending_tasks', 0)} | {w.get('thread') or '-'} | `{w['where']}` |"
        )
    return lines


def _collectives(report: dict[str, Any]) -> list[str]:
    collectives = report.get("collectives")
    if not collectives:
        return []
    lines = ["", "## Collectives (Flight Recorder)", ""]
    return lines + ["  " * depth + f"- {line}" for depth, line in collective_lines(collectives)]


ROLLOUT_SIDE = ("rollout_stalled", "weight_sync_stuck")  # verdicts a replay cannot reproduce


def _replay(report: dict[str, Any]) -> list[str]:
    trajectory = report.get("trajectory")
    if not trajectory:
        return []
    lines = [
        "",
        "## Replay",
        "",
        f"Last dumped step: {trajectory.get('step')}",
        "",
        f"```\n{trajectory.get('replay_command')}\n```",
    ]
    if report.get("category") in ROLLOUT_SIDE:
        lines += ["", "A replay has no rollout: it retrains the dumped batch, not this stall."]
    return lines


def _files(report: dict[str, Any]) -> list[str]:
    files = report["files"]
    return [
        "",
        "## Files",
        "",
        f"- Stacks: `{files['stacks_dir']}`",
        f"- Log tails: `{files['logs_dir']}`",
        f"- Raw evidence: `{files['evidence']}`",
    ]
