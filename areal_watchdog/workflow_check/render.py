"""The check as people read it: which workflow and server, a row per stage (episodes done,
failed, pending; latency p50/p90/max; episodes per second), the staleness gate in numbers, the
episodes pending at a stage's limit with their await chains, and a last line saying what
passed."""

from __future__ import annotations

import os
from typing import Any

from areal_watchdog.workflow_check.model import CheckResult, StageResult
from areal_watchdog.workflow_check.staleness import Staleness

HEADER = ("stage", "episodes", "done", "failed", "pending", "not started", "p50", "p90", "max",
          "episodes/s")  # fmt: skip
STAGE_NAMES = ("one episode", "one batch", "AReaL engine")


def render(result: CheckResult, server: str) -> str:
    lines = [
        f"workflow: {result.workflow or '?'}{reward_words(result)}",
        f"server:   {server}" + (f" (client {result.engine})" if result.engine else ""),
        "",
    ]
    if result.error:
        return "\n".join([*lines, f"not checked: {result.error}"])
    lines += _table(result.stages)
    if result.staleness:
        lines += ["", f"staleness: {Staleness.from_dict(result.staleness).sentence()}"]
    gate_shut = bool(result.staleness) and Staleness.from_dict(result.staleness).trapped
    for stage in result.stages:
        lines += _problems(stage, gate_shut)
    return "\n".join([*lines, "", verdict(result)])


def reward_words(result: CheckResult) -> str:
    """What the workflow scored with: the reward it called, else what the script named and
    that the check could not tell (no episode called AReaL's ``AsyncRewardWrapper``)."""
    named, called = result.reward, result.reward_called
    if called:
        other = f" (workflow_kwargs named {named})" if named and named not in called else ""
        return f", reward {', '.join(called)}{other}"
    if not result.stages:
        return f", reward {named} (named in workflow_kwargs)" if named else ""
    given = f"workflow_kwargs named {named}, but " if named else ""
    return f", reward: could not tell ({given}no episode called AReaL's AsyncRewardWrapper)"


def _table(stages: list[StageResult]) -> list[str]:
    rows = [HEADER] + [
        (
            f"{i}. {s.name}",
            str(s.planned),
            str(s.done + s.rejected),
            str(s.failed),
            str(s.pending),
            str(s.not_started),
            _seconds(s.percentile(0.5)),
            _seconds(s.percentile(0.9)),
            _seconds(max(s.latencies, default=None)),
            f"{s.per_second:.2f}",
        )  # fmt: skip
        for i, s in enumerate(stages, 1)
    ]
    widths = [max(len(r[c]) for r in rows) for c in range(len(HEADER))]
    table = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return table + [f"   {i}. {s.detail}" for i, s in enumerate(stages, 1)]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _problems(stage: StageResult, gate_shut: bool) -> list[str]:
    lines: list[str] = []
    if stage.errors:
        lines += ["", f"{stage.name}: errors"] + [f"  {e}" for e in stage.errors]
    if stage.blocked_loop:
        lines += ["", f"{stage.name}: {_blocked(stage)}, so no other episode can run; its "
                  "stack, innermost last:", f"  {_chain(stage.blocked_loop)}"]  # fmt: skip
    waiting = [p for p in stage.pending_episodes if not p.get("holds_loop")]
    if waiting:
        count = stage.pending - bool(stage.blocked_by)
        other = "other " if stage.blocked_by else ""
        lines += ["", f"{stage.name}: {count} {other}episode{'s' if count > 1 else ''} pending "
                  f"at the limit ({stage.limit_s:g} s), innermost last:"]  # fmt: skip
        lines += [_pending(p, bool(stage.blocked_loop)) for p in waiting]
    if stage.not_started and not stage.pending_episodes:
        why = ": the staleness gate above holds them" if gate_shut else ""
        lines += ["", f"{stage.name}: {stage.not_started} episodes never started{why}"]
    return lines


def _blocked(stage: StageResult) -> str:
    """Where the loop is held, and by which episode when one holds it."""
    by = f" by {stage.blocked_by}" if stage.blocked_by else ""
    return f"the event loop is blocked{by} in synchronous code at {_chain(stage.blocked_loop[-1:])}"


def _pending(entry: dict[str, Any], loop_blocked: bool) -> str:
    if loop_blocked:  # what it awaits cannot answer before the loop runs again
        state = " (cannot resume while the loop is blocked)"
    else:
        state = f" (awaits {entry['awaiting']})" if entry.get("awaiting") else ""
    return f"  {entry['episode']}, {entry['pending_s']:g} s{state}: {_chain(entry['chain'])}"


def _chain(links: list[dict[str, Any]]) -> str:
    return " > ".join(
        f"{link['name']} ({os.path.basename(link['filename'])}:{link['line']})"
        if link.get("filename") else link["name"]
        for link in links
    ) or "no frame"  # fmt: skip


def verdict(result: CheckResult) -> str:
    """The last line: every stage passed, or the first that did not and why."""
    if result.error:
        return f"not checked: {result.error}"
    failing = next((s for s in result.stages if not s.passed), None)
    if failing is None:
        return f"passed: {len(result.stages)} stages, every episode ended"
    index = result.stages.index(failing) + 1
    what = ", ".join(
        f"{n} {label}" for n, label in ((failing.failed, "failed"), (failing.pending, "pending"),
                                        (failing.not_started, "never started")) if n
    )  # fmt: skip
    if failing.blocked_loop:
        what = f"{_blocked(failing)}; {what}"
    skipped = ", ".join(STAGE_NAMES[index:])
    rest = f"; not run: {skipped} (fix this stage first)" if skipped else ""
    episodes = f"{failing.planned} episode{'s' if failing.planned > 1 else ''}"
    return f"failed at stage {index} ({failing.name}): {what} of {episodes}{rest}"
