"""``on_hang: resume``: after the report, the job is ended and started again, as
``recover.policy`` decides, until it completes or the policy stops.

Before a resume, the hung step is replayed on one node when the run dumped it (this one; on
Slurm one of a one-node allocation: ``replay_decides``): a step that hangs the same way is
bisected and its hanging rows are left out of the resumed run (``quarantine.json``). An
AReaL job restarts from AReaL's recover checkpoint; a torchrun script from its own, told by two
variables (``ENV_ATTEMPT``, ``ENV_LAST_STEP``). What happened is kept in
``watchdog/recovery.json`` (``areal-launch status`` shows it) and in each hang's report (its
``recovery`` section).
"""

from __future__ import annotations

import contextlib
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from areal_watchdog.common.atomic import read_json, write_json_atomic, write_text_atomic
from areal_watchdog.config.model import JobConfig
from areal_watchdog.config.sinks import SinkSpec
from areal_watchdog.launch.backend import Backend
from areal_watchdog.launch.exit_codes import ExitCode
from areal_watchdog.launch.planning.plan import LaunchPlan
from areal_watchdog.recover.checks import ENV_ATTEMPT, ENV_LAST_STEP
from areal_watchdog.recover.notices import send_recovery
from areal_watchdog.recover.policy import Decision, Hang, decide
from areal_watchdog.recover.replay_decides import ReplayFinding, replay_decides
from areal_watchdog.report.build import iso, stamp
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.sidecar_files.hang_request import HangRequest
from areal_watchdog.rundir.sidecar_files.incidents import newest_report
from areal_watchdog.trajectory.quarantine import APPLIED, ENV_QUARANTINE
from areal_watchdog.trajectory.replay.areal_replay import recover_info_dir, recovered_step

# A hang's record entry as its report's ``recovery`` section shows it (report/schema.json).
RECOVERY_FIELDS = (
    "attempt", "max_attempts", "decision", "reason", "backoff_s", "relaunched_at", "time_lost_s",
    "replay", "replays", "narrowed", "rows_skipped", "rows_left_out", "resumes_after_step",
    "nodes_excluded", "allocation",
)  # fmt: skip


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
    """Execute ``plan``; after each hang, decide, and execute a resumed plan. A Slurm
    allocation kept for a resume is released however this ends."""
    try:
        return _resume_loop(target, config, plan, out)
    finally:
        target.release()


def _resume_loop(target: Backend, config: JobConfig, plan: LaunchPlan, out: TextIO) -> int:
    layout = RunLayout(Path(plan.run_dir))
    wd = config.watchdog
    record, hangs = _Record(layout, wd.resume.max_attempts), []
    excluded: set[str] = set()  # Slurm: nodes the hangs named, left out of the next allocation
    while True:
        started = time.time()
        code = target.execute(plan, out)
        if hangs:
            _left_out(layout, record, plan.run_id)
        if code != ExitCode.HANG_CANCELLED:
            return _ended(code, len(hangs), record, out)
        incident_id, report = _newest_hang(layout, started)
        hangs.append(Hang.from_report(report, incident_id, hangs[-1].step if hangs else None))
        try:
            decision, finding = _decide(config, layout, hangs, report, out, target, excluded)
        except KeyboardInterrupt:
            _say(out, "interrupted while replaying: not resuming")
            record.end("interrupted before resuming")
            return ExitCode.INTERRUPTED
        entry = _entry(len(hangs), wd.resume.max_attempts, hangs[-1], decision, report)
        entry.update(_replayed(finding, config, hangs[-1], decision))
        transient = decision.resume and not (finding and finding.same_hang)
        if transient and target.recovery.leaves_out_nodes():  # not on those nodes again
            excluded |= target.recovery.known_nodes(_named_nodes(report))
        entry["nodes_excluded"] = sorted(excluded)
        entry["allocation"] = target.recovery.allocation()
        record.add(entry)
        _say(out, decision.reason)
        if isinstance(report, dict):  # the disk took it: the report and the sinks hear it
            _tell(layout, config, report, {k: entry[k] for k in RECOVERY_FIELDS}, out)
        if not decision.resume:
            record.end(f"stopped: {decision.reason}")
            return code
        if not _wait(decision.backoff_s, out):
            record.end("interrupted before resuming")
            return ExitCode.INTERRUPTED
        plan = _resumed_plan(target, config, len(hangs), hangs[-1].step, excluded)


def _ended(code: int, hangs: int, record: _Record, out: TextIO) -> int:
    """The run ended without a hang: say how, after resumes."""
    if hangs:
        outcome = "completed" if code == ExitCode.OK else f"ended with exit code {code}"
        _say(out, f"after {hangs} resume(s) the job {outcome}")
        record.end(outcome)
    return code


def _decide(
    config: JobConfig, layout: RunLayout, hangs: list[Hang], report: dict[str, Any] | None,
    out: TextIO, target: Backend, excluded: set[str],
) -> tuple[Decision, ReplayFinding | None]:  # fmt: skip
    """The policy's decision, the replays' finding first when it may resume (a stop needs
    no replay). The replays run where the backend says, on none of the nodes the run's hangs
    named (``excluded``, this one's too): on Slurm in the job's kept allocation, else in one
    of their own."""
    wd = config.watchdog
    decision = decide(hangs, wd.resume.max_attempts, wd.resume.backoff)
    if not decision.resume:
        return decision, None
    avoid = excluded | target.recovery.known_nodes(_named_nodes(report))
    host = target.recovery.replay_host(config, avoid)
    finding = replay_decides(config, layout.run_dir, hangs[-1], report, out, host)
    note, stops = (finding.note, finding.stop) if finding else (None, False)
    return decide(hangs, wd.resume.max_attempts, wd.resume.backoff, note, stops), finding


def _tell(
    layout: RunLayout, config: JobConfig, report: dict[str, Any], section: dict[str, Any],
    out: TextIO,
) -> None:  # fmt: skip
    """The decision in the hang's report, and to every sink."""
    _note_in_report(layout, report, section)
    sinks = [SinkSpec.from_dict(d) for d in config.watchdog.notify]
    send_recovery(sinks, layout.spool_dir, report, section, lambda m: _say(out, m))


def _replayed(
    finding: ReplayFinding | None, config: JobConfig, hang: Hang, decision: Decision
) -> dict[str, Any]:
    """The replays' part of a hang's record: what they showed, the rows left out, and the step
    the job restarts after (an AReaL job: its recover checkpoint's)."""
    restart = None
    if decision.resume:
        info = recover_info_dir(config.raw)
        restart = recovered_step(info) if info else hang.step
    rows = finding.quarantined if finding else []
    return {
        "replay": finding.note if finding else None,
        "replays": [r.as_dict() for r in finding.replays] if finding else [],
        "narrowed": finding.narrowed if finding else None,
        "rows_skipped": [{"step": r.step, "group": r.group, "prompt": r.prompt} for r in rows],
        "rows_left_out": None,  # what the resumed run's filter left out, once it said
        "resumes_after_step": restart,
    }


def _left_out(layout: RunLayout, record: _Record, run_id: str) -> None:
    """What the resumed run's filter said it left out of its data (``quarantine_applied.json``,
    rank 0), into the record and the report of the hang it resumed after."""
    applied = read_json(layout.run_dir / APPLIED)
    if not isinstance(applied, dict) or applied.get("run_id") != run_id:
        return
    entry = record.doc["attempts"][-1]
    entry["rows_left_out"] = applied.get("left_out")
    entry["left_out_said"] = applied.get("said")
    record.save()
    report = read_json(layout.incidents_dir / str(entry.get("incident_id")) / "report.json")
    if isinstance(report, dict):
        _note_in_report(layout, report, {k: entry.get(k) for k in RECOVERY_FIELDS})


def _named_nodes(report: dict[str, Any] | None) -> set[str]:
    """The nodes a hang's evidence names: its culprits' and the ones that stopped answering;
    never this host, which runs the launcher (and AReaL's controller), not the job's ranks."""
    report = report or {}
    names = [*(report.get("culprit_nodes") or []), *(report.get("unanswered_nodes") or [])]
    return {n for n in names if isinstance(n, str) and n} - {socket.gethostname()}


def _resumed_plan(
    target: Backend, config: JobConfig, attempt: int, step: int | None, excluded: set[str]
) -> LaunchPlan:
    """The same launch with the resume variables (and the quarantine, when there is one),
    without the ``excluded`` nodes; the run's recovery record is kept."""
    env = {**config.launch.env, ENV_ATTEMPT: str(attempt), ENV_LAST_STEP: str(step or 0)}
    quarantine = RunLayout(config.run_dir.resolve()).quarantine_file
    if quarantine.is_file():
        env[ENV_QUARANTINE] = str(quarantine)
    resumed = replace(config, launch=replace(config.launch, env=env))
    plan = target.plan(target.recovery.without_nodes(resumed, excluded), watchdog=True)
    keep = str(RunLayout(Path(plan.run_dir)).recovery_file)
    return replace(plan, reset_paths=[p for p in plan.reset_paths if p != keep])


def _newest_hang(layout: RunLayout, since: float) -> tuple[str | None, dict[str, Any] | None]:
    """The incident that ended this attempt: as the sidecar recorded its cancel, else the
    newest report written since the attempt started (a full disk may have kept both away)."""
    request = HangRequest.read(layout)
    if request is not None:
        incident = layout.incidents_dir / request.incident_id
        return request.incident_id, read_json(incident / "report.json")
    return newest_report(layout, since)


def _entry(
    attempt: int, max_attempts: int, hang: Hang, decision: Decision, report: dict[str, Any] | None
) -> dict[str, Any]:
    """One hang's line in the record and its report's ``recovery`` section."""
    relaunch = time.time() + decision.backoff_s if decision.resume else None
    report = report or {}
    stalled_since = stamp(report.get("last_progress_at") or report.get("detected_at"))
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


def _note_in_report(layout: RunLayout, report: dict[str, Any], section: dict[str, Any]) -> None:
    """Add the decision to the hang's report.json and report.md."""
    directory = layout.incidents_dir / str(report["incident_id"])
    with contextlib.suppress(OSError):
        write_json_atomic(directory / "report.json", {**report, "recovery": section})
        markdown = (directory / "report.md").read_text(encoding="utf-8")
        markdown = markdown.split(f"\n{RECOVERY_HEADING}\n")[0]  # written again: updated
        write_text_atomic(directory / "report.md", f"{markdown}\n{recovery_markdown(section)}")


RECOVERY_HEADING = "## Recovery"


def recovery_markdown(section: dict[str, Any]) -> str:
    """The report's "Recovery" paragraph: the decision, the replays, what the bisection
    narrowed, the rows left out and how many the resumed run's filter removed."""
    lines = [
        RECOVERY_HEADING,
        "",
        f"Hang {section['attempt']} (at most {section['max_attempts']} resumes): "
        f"{section['reason']}.",
    ]
    if section.get("replays"):
        lines += ["", "Replays of the hung step, each on one node:", ""]
        lines += [f"- {_replay_line(replay)}" for replay in section["replays"]]
    narrowed = section.get("narrowed")
    if narrowed:
        lines += ["", _narrowed_line(narrowed)]
    if section.get("rows_skipped"):
        lines += ["", "Rows left out of the resumed run (`quarantine.json`):", ""]
        lines += [f"- step {r['step']}, group {r['group']}: `{r['prompt'][:300]!r}`"
                  for r in section["rows_skipped"]]  # fmt: skip
    if section.get("rows_left_out") is not None:
        lines += ["", f"The resumed run's filter removed {section['rows_left_out']} row(s) of "
                      "its training data (`quarantine_applied.json`)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def _replay_line(replay: dict[str, Any]) -> str:
    """One replay: what it fed and how it ended (one that never started says why)."""
    fed = "the whole batch" if replay["groups"] is None else f"groups {replay['groups']}"
    if replay.get("groups_of") is not None:
        fed += f" of step {replay['groups_of']} (which trained)"
    if replay.get("error"):
        return f"{fed}: never started: {replay['error']}"
    shown = f"hung: {replay['hang']}" if replay["hung"] else "no hang"
    return (f"{fed}: {shown} (exit code {replay['exit_code']}, {replay['seconds']} s), "
            f"`{replay.get('run_dir')}`")  # fmt: skip


def _narrowed_line(narrowed: dict[str, Any]) -> str:
    """What the bisection narrowed, in how many replays."""
    replays, total = narrowed["replays"], narrowed["groups"]
    if narrowed.get("step_keyed"):
        return (f"Bisection: {replays} replay(s); every subset hung the same way, and a "
                "group of the step before too: the hang follows the step, nothing is "
                "quarantined.")  # fmt: skip
    found = narrowed["to"]
    if len(found) == total:
        return f"Bisection: {replays} replay(s) could not narrow the {total} groups."
    return (f"Bisection: {replays} replay(s) narrowed the {total} groups to "
            f"{len(found)}: groups {found}.")  # fmt: skip


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
        replays, rows = entry.get("replays") or [], entry.get("rows_skipped") or []
        excluded = entry.get("nodes_excluded") or []
        lines.append(
            f"    hang {entry.get('attempt', '?')}: {entry.get('hang', '?')}: "
            f"{entry.get('decision', '?')}"
            + (f", time lost {entry['time_lost_s']} s" if entry.get("time_lost_s") else "")
            + (f", {len(replays)} replay(s)" if replays else "")
            + (f", {len(rows)} row(s) quarantined" if rows else "")
            + (
                f", {entry['rows_left_out']} row(s) removed from the data by the resumed run"
                if entry.get("rows_left_out") is not None
                else ""
            )  # fmt: skip
            + (f", nodes excluded {', '.join(map(str, excluded))}" if excluded else "")
            + (f", allocation {entry['allocation']}" if entry.get("allocation") else "")
        )
    if doc.get("outcome"):
        lines.append(f"    outcome: {doc['outcome']}")
    return lines
