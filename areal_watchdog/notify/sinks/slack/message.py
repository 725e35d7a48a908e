"""The Slack incoming-webhook message for a report, always inside Slack's limits.

Limits (field notes): ``text`` always set (the notification fallback), at most 50 blocks, at
most 3000 characters per section text, a header of at most 150 characters. At most 15 stack
groups are listed; the tail folds into one "... and N more groups" line.
"""

from __future__ import annotations

from typing import Any

from areal_watchdog.notify.digest import (
    MAX_GROUPS_SHOWN,
    MAX_WHERE_CHARS,
    clip,
    facts,
    fold_line,
    headline,
    job_name,
    ranks,
    replay_command,
    report_path,
)

MAX_BLOCKS = 50
MAX_SECTION_CHARS = 3000
MAX_HEADER_CHARS = 150
MAX_TOTAL_CHARS = 30_000  # well inside Slack's message size limit


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": clip(text, MAX_SECTION_CHARS)}}


def build_slack_message(report: dict[str, Any]) -> dict[str, Any]:
    """The JSON body to POST to a Slack incoming webhook."""
    text = clip(
        f"[areal-watchdog] {report['category']} in {job_name(report)}: {report['summary']}",
        MAX_SECTION_CHARS,
    )
    blocks = _head_blocks(report) + _collective_blocks(report)
    tail = _tail_blocks(report)
    budget = MAX_TOTAL_CHARS - sum(len(str(b)) for b in blocks + tail) - len(text)
    room = min(MAX_GROUPS_SHOWN, MAX_BLOCKS - len(blocks) - len(tail) - 1)  # keep the fold line
    return {"text": text, "blocks": blocks + _group_blocks(report["groups"], room, budget) + tail}


def _head_blocks(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Header, summary and the facts: culprits (ranks, nodes, workers), step, stuck, size."""
    fields = [{"type": "mrkdwn", "text": clip(f"*{k}*\n{v}", 2000)} for k, v in facts(report)[:10]]
    header = clip(headline(report), MAX_HEADER_CHARS)
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
    where = clip(f"Full report: `{report_path(report)}`", MAX_SECTION_CHARS)
    tail: list[dict[str, Any]] = [
        {"type": "context", "elements": [{"type": "mrkdwn", "text": where}]}
    ]
    replay = replay_command(report)
    if replay:
        tail.append(_section(f"Replay the last dumped step:\n```{replay}```"))
    return tail


def _group_blocks(groups: list[dict[str, Any]], room: int, budget: int) -> list[dict[str, Any]]:
    """As many stack groups as fit; the rest fold into one "... and N more" line."""
    blocks: list[dict[str, Any]] = []
    for group in groups:
        block = _section(f"*{ranks(group['ranks'])}*: `{clip(group['where'], MAX_WHERE_CHARS)}`")
        cost = len(str(block))
        if len(blocks) >= room or cost > budget:
            break
        blocks.append(block)
        budget -= cost
    hidden = groups[len(blocks) :]
    if hidden:
        blocks.append(_section(f"{fold_line(hidden)}."))
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
