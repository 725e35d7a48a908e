"""The Slack incoming-webhook message for a report, always inside Slack's limits.

Limits (field notes): ``text`` always set (the notification fallback), at most 50 blocks, at
most 3000 characters per section text, a header of at most 150 characters. At most 15 stack
groups are listed; the tail folds into one "... and N more groups" line.
"""

from __future__ import annotations

from typing import Any

from areal_watchdog.common.rankset import format_ranks, worker_label
from areal_watchdog.notify.envelope import is_warning

MAX_BLOCKS = 50
MAX_SECTION_CHARS = 3000
MAX_HEADER_CHARS = 150
MAX_TOTAL_CHARS = 30_000  # well inside Slack's message size limit
MAX_RANKS_CHARS = 240  # a rank list longer than this is cut with a count
MAX_WHERE_CHARS = 400
MAX_GROUPS_SHOWN = 15  # more sections than this are unreadable in a channel: fold the rest


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _ranks(ranks: list[int]) -> str:
    text = format_ranks(ranks)
    if len(text) <= MAX_RANKS_CHARS:
        return text
    return f"{text[:MAX_RANKS_CHARS].rsplit(',', 1)[0]}, \u2026 ({len(ranks)} ranks)"


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": _clip(text, MAX_SECTION_CHARS)}}


def build_slack_message(report: dict[str, Any]) -> dict[str, Any]:
    """The JSON body to POST to a Slack incoming webhook."""
    job = report["job"]
    name = f"{job.get('experiment_name') or '?'}/{job.get('trial_name') or '?'}"
    text = _clip(
        f"[areal-watchdog] {report['category']} in {name}: {report['summary']}", MAX_SECTION_CHARS
    )
    blocks = _head_blocks(report, name) + _collective_blocks(report)
    tail = _tail_blocks(report)
    budget = MAX_TOTAL_CHARS - sum(len(str(b)) for b in blocks + tail) - len(text)
    room = min(MAX_GROUPS_SHOWN, MAX_BLOCKS - len(blocks) - len(tail) - 1)  # keep the fold line
    return {"text": text, "blocks": blocks + _group_blocks(report["groups"], room, budget) + tail}


def _head_blocks(report: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """Header, summary and the facts: culprits (ranks, nodes, workers), step, stuck, size."""
    job = report["job"]
    stalled = report.get("stalled_for_s")
    stuck = f"{stalled:.0f} s" if isinstance(stalled, (int, float)) else "-"
    facts = [
        ("Culprit ranks", _ranks(report["culprit_ranks"]) or "none named"),
        ("Culprit nodes", ", ".join(report["culprit_nodes"]) or "-"),
        ("Last step", str(report["last_step"])),
        ("Stuck for", stuck),
        ("World size", str(job["world_size"])),
        ("Confidence", str(report["confidence"])),
    ]
    if report.get("cause"):
        facts.append(("Cause", report["cause"]))
    workers = [worker_label(w) for w in report.get("culprit_workers") or []]
    if workers:
        facts.append(("Culprit workers", "; ".join(workers)))
    fields = [{"type": "mrkdwn", "text": _clip(f"*{k}*\n{v}", 2000)} for k, v in facts[:10]]
    warning = "Warning: " if is_warning(report) else ""
    header = _clip(f"{warning}{report['category']} in {name}", MAX_HEADER_CHARS)
    return [
        {"type": "header", "text": {"type": "plain_text", "emoji": False, "text": header}},
        _section(f"*{report['summary']}*"),
        {"type": "section", "fields": fields},
        {"type": "divider"},
    ]


def _collective_blocks(report: dict[str, Any]) -> list[dict[str, Any]]:
    collectives = report.get("collectives")
    if not collectives:
        return []
    rows = [f"group {g['group']}: {'; '.join(g['table'])}" for g in collectives["groups"]]
    body = "\n".join(rows[:8])
    return [
        _section(f"*Collective record* (Flight Recorder)\n{body}\n_{collectives['agreement']}_")
    ]


def _tail_blocks(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Where the full report is, and the command that replays the last dumped step."""
    where = _clip(f"Full report: `{report['files']['incident_dir']}`", MAX_SECTION_CHARS)
    tail: list[dict[str, Any]] = [
        {"type": "context", "elements": [{"type": "mrkdwn", "text": where}]}
    ]
    replay = (report.get("trajectory") or {}).get("replay_command")
    if replay:
        tail.append(_section(f"Replay the last dumped step:\n```{replay}```"))
    return tail


def _group_blocks(groups: list[dict[str, Any]], room: int, budget: int) -> list[dict[str, Any]]:
    """As many stack groups as fit; the rest fold into one "... and N more" line."""
    blocks: list[dict[str, Any]] = []
    for group in groups:
        block = _section(f"*{_ranks(group['ranks'])}*: `{_clip(group['where'], MAX_WHERE_CHARS)}`")
        cost = len(str(block))
        if len(blocks) >= room or cost > budget:
            break
        blocks.append(block)
        budget -= cost
    hidden = groups[len(blocks) :]
    if hidden:
        ranks = sum(len(g["ranks"]) for g in hidden)
        blocks.append(
            _section(
                f"\u2026 and {len(hidden)} more stack groups ({ranks} ranks): see the full report."
            )
        )
    return blocks


def check_limits(message: dict[str, Any]) -> list[str]:
    """Every way the message breaks Slack's limits (empty when it is valid)."""
    problems = []
    if not message.get("text"):
        problems.append("no fallback text")
    blocks = message.get("blocks", [])
    if len(blocks) > MAX_BLOCKS:
        problems.append(f"{len(blocks)} blocks > {MAX_BLOCKS}")
    for index, block in enumerate(blocks):
        texts = [block.get("text", {}).get("text", "")] if "text" in block else []
        texts += [f.get("text", "") for f in block.get("fields", [])]
        texts += [e.get("text", "") for e in block.get("elements", [])]
        limit = MAX_HEADER_CHARS if block["type"] == "header" else MAX_SECTION_CHARS
        problems += [f"block {index}: {len(t)} chars > {limit}" for t in texts if len(t) > limit]
        if len(block.get("fields", [])) > 10:
            problems.append(f"block {index}: more than 10 fields")
    if len(str(message)) > 40_000:
        problems.append("message larger than 40,000 characters")
    return problems
