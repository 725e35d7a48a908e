"""``on_hang: resume``: after the report, the job is ended and started again, as
``resume_policy`` decides, until it completes or the policy stops.

The script restarts from its own checkpoint; it learns that it resumes from two variables
(``ENV_ATTEMPT``, ``ENV_LAST_STEP``). What happened is kept in ``watchdog/recovery.json``
(``areal-launch status`` shows it) and in each hang's report (its ``recovery`` section).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from areal_watchdog.common.atomic import mtime, read_json, write_json_atomic, write_text_atomic
from areal_watchdog.common.errors import UserError
from areal_watchdog.config.model import JobConfig
from areal_watchdog.launch.backend import Backend
from areal_watchdog.launch.exit_codes import ExitCode
from areal_watchdog.launch.plan import LaunchPlan
from areal_watchdog.launch.resume_policy import Decision, Hang, decide
from areal_watchdog.notify.recovery import send_recovery
from areal_watchdog.notify.sinks import SinkSpec
from areal_watchdog.report.build import iso
from areal_watchdog.rundir.layout import RunLayout

ENV_ATTEMPT = "AREAL_WATCHDOG_RESUME_ATTEMPT"  # 1 on the first resume, 2 on the next, ...
ENV_LAST_STEP = "AREAL_WATCHDOG_RESUME_LAST_STEP"  # the last step seen before the hang
# A hang's record entry as its report's ``recovery`` section shows it (report/schema.json).
RECOVERY_FIELDS = (
    "attempt", "max_attempts", "decision", "reason", "backoff_s", "relaunched_at", "time_lost_s",
)  # fmt: skip


def check_resumable(config: JobConfig, backend: str, mode: str) -> None:
    """Refuse, in one line, a resume this release cannot do yet."""
    if config.watchdog.on_hang == "resume" and (backend, mode) != ("local", "torchrun"):
        raise UserError(
            f"{config.source}: watchdog.on_hang: resume starts torchrun scripts again on the "
            f"local backend (this is {backend}, {mode}); use on_hang: cancel here for now"
        )


def resume_notes(config: JobConfig) -> list[str]:
    """What ``--dry-run`` says a resume would run."""
    wd = config.watchdog
    waits = ", ".join(f"{wd.resume_backoff * 2**n:g} s" for n in range(wd.resume_max_attempts))
    return [
        f"on a hang (watchdog.on_hang: resume): the report first, then the job is ended and this "
        f"plan runs again, up to {wd.resume_max_attempts} time(s) (after {waits}), with",
        f"  {ENV_ATTEMPT}=<1, 2, ...>",
        f"  {ENV_LAST_STEP}=<the last step seen before the hang>",
        "  and stops when the same hang comes back at the same step (docs/recovery.md)",
    ]


class _Record:
    """``watchdog/recovery.json``: every hang of the run and what was decided."""

    def __init__(self, layout: RunLayout, max_attempts: int) -> None:
        self.path = layout.recovery_file
        self.doc: dict[str, Any] = {"max_attempts": max_attempts, "attempts": [], "outcome": None}

    def add(self, entry: dict[str, Any]) -> None:
        self.doc["attempts"].append(entry)
        self.save()

    def end(self, outcome: str) -> None:
        self.doc["outcome"] = outcome
        self.save()

    def save(self) -> None:
        with contextlib.suppress(OSError):  # a full disk loses the record, never the job
            write_json_atomic(self.path, self.doc)


def run_resuming(target: Backend, config: JobConfig, plan: LaunchPlan, out: TextIO) -> int:
    """Execute ``plan``; after each hang, decide, and execute a resumed plan."""
    layout = RunLayout(Path(plan.run_dir))
    wd = config.watchdog
    record, hangs = _Record(layout, wd.resume_max_attempts), []
    while True:
        started = time.time()
        code = target.execute(plan, out)
        if code != ExitCode.HANG_CANCELLED:
            if hangs:
                outcome = "completed" if code == ExitCode.OK else f"ended with exit code {code}"
                _say(out, f"after {len(hangs)} resume(s) the job {outcome}")
                record.end(outcome)
            return code
        incident_id, report = _newest_hang(layout, started)
        hangs.append(Hang.from_report(report, incident_id, hangs[-1].step if hangs else None))
        decision = decide(hangs, wd.resume_max_attempts, wd.resume_backoff)
        entry = _entry(len(hangs), wd.resume_max_attempts, hangs[-1], decision, report)
        record.add(entry)
        _say(out, decision.reason)
        if isinstance(report, dict):  # the disk took it: the report and the sinks hear it
            section = {k: entry[k] for k in RECOVERY_FIELDS}
            _note_in_report(layout, report, section)
            sinks = [SinkSpec.from_dict(d) for d in wd.notify]
            send_recovery(sinks, layout.spool_dir, report, section, lambda m: _say(out, m))
        if not decision.resume:
            record.end(f"stopped: {decision.reason}")
            return code
        if not _wait(decision.backoff_s, out):
            record.end("interrupted before resuming")
            return ExitCode.INTERRUPTED
        plan = _resumed_plan(target, config, len(hangs), hangs[-1].step)


def _resumed_plan(target: Backend, config: JobConfig, attempt: int, step: int | None) -> LaunchPlan:
    """The same launch with the resume variables; the run's recovery record is kept."""
    env = {**config.launch.env, ENV_ATTEMPT: str(attempt), ENV_LAST_STEP: str(step or 0)}
    plan = target.plan(replace(config, launch=replace(config.launch, env=env)), watchdog=True)
    keep = str(RunLayout(Path(plan.run_dir)).recovery_file)
    return replace(plan, reset_paths=[p for p in plan.reset_paths if p != keep])


def _newest_hang(layout: RunLayout, since: float) -> tuple[str | None, dict[str, Any] | None]:
    """The incident that ended this attempt: as the sidecar recorded its cancel, else the
    newest report written since the attempt started (a full disk may have kept both away)."""
    cancel = read_json(layout.cancel_file)
    if isinstance(cancel, dict) and isinstance(cancel.get("incident_id"), str):
        incident_id = cancel["incident_id"]
        return incident_id, read_json(layout.incidents_dir / incident_id / "report.json")
    reports = [p for p in layout.incidents_dir.glob("*/report.json") if mtime(p) >= since]
    if not reports:
        return None, None
    newest = max(reports, key=mtime)
    return newest.parent.name, read_json(newest)


def _entry(
    attempt: int, max_attempts: int, hang: Hang, decision: Decision, report: dict[str, Any] | None
) -> dict[str, Any]:
    """One hang's line in the record and its report's ``recovery`` section."""
    relaunch = time.time() + decision.backoff_s if decision.resume else None
    report = report or {}
    stalled_since = _stamp(report.get("last_progress_at") or report.get("detected_at"))
    lost = None if relaunch is None or stalled_since is None else round(relaunch - stalled_since, 1)
    return {
        "attempt": attempt,
        "max_attempts": max_attempts,
        "incident_id": hang.incident_id,
        "hang": hang.describe(),
        "step": hang.step,
        "decision": "resume" if decision.resume else "stop",
        "reason": decision.reason,
        "backoff_s": decision.backoff_s,
        "relaunched_at": iso(relaunch),
        "time_lost_s": lost,
    }


def _stamp(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _note_in_report(layout: RunLayout, report: dict[str, Any], section: dict[str, Any]) -> None:
    """Add the decision to the hang's report.json and report.md."""
    directory = layout.incidents_dir / str(report["incident_id"])
    with contextlib.suppress(OSError):
        write_json_atomic(directory / "report.json", {**report, "recovery": section})
        markdown = (directory / "report.md").read_text(encoding="utf-8")
        said = f"Hang {section['attempt']} (at most {section['max_attempts']} resumes): " + (
            f"{section['reason']}."
        )
        write_text_atomic(directory / "report.md", f"{markdown}\n## Recovery\n\n{said}\n")


def _wait(seconds: float, out: TextIO) -> bool:
    """The pause before a resume; False when interrupted (Ctrl-C)."""
    if seconds > 0:
        _say(out, f"resuming in {seconds:g} s (Ctrl-C to stop here)")
    try:
        time.sleep(seconds)
    except KeyboardInterrupt:
        _say(out, "interrupted: not resuming")
        return False
    return True


def _say(out: TextIO, message: str) -> None:
    print(f"[areal-launch] {message}", file=out, flush=True)


def recovery_lines(run_dir: Path) -> list[str]:
    """What ``areal-launch status`` shows of the run's resumes (a damaged record shows ``?``)."""
    doc = read_json(RunLayout(run_dir).recovery_file)
    if not isinstance(doc, dict) or not isinstance(doc.get("attempts"), list):
        return []
    lines = [f"  resumes (on_hang: resume, at most {doc.get('max_attempts', '?')}):"]
    for entry in doc["attempts"]:
        entry = entry if isinstance(entry, dict) else {}
        lines.append(
            f"    hang {entry.get('attempt', '?')}: {entry.get('hang', '?')}: "
            f"{entry.get('decision', '?')}"
            + (f", time lost {entry['time_lost_s']} s" if entry.get("time_lost_s") else "")
        )
    if doc.get("outcome"):
        lines.append(f"    outcome: {doc['outcome']}")
    return lines
