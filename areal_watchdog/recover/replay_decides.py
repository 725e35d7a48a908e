"""Before a resume, replay the step that hung on this node, watched, and bisect its batch when
it hangs the same way: the hang then follows the data, and the rows that hang are quarantined.

Each replay is ``areal-launch replay RUN_DIR --step N [--groups G]`` with ``on_hang: cancel``
and no notification (the incident is the original's; its recovery event lists the replays), run
where its host says: in this process on this node (``LocalReplayHost``), or on Slurm on a node
of an allocation of its own (``launch.slurm.replay``). Its terminal output goes to
``<replay run dir>/areal-launch.log``.
"""

from __future__ import annotations

import contextlib
import io
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from areal_watchdog.common.errors import UserError
from areal_watchdog.common.rankset import format_ranks
from areal_watchdog.config.model import JobConfig
from areal_watchdog.launch.exit_codes import ExitCode
from areal_watchdog.launch.local import LocalBackend
from areal_watchdog.recover.bisect import Bisection, bisect
from areal_watchdog.recover.policy import Hang
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.sidecar_files.incidents import newest_report
from areal_watchdog.trajectory.format import ENV_REPLAY_DIR, DumpError, complete_steps
from areal_watchdog.trajectory.quarantine import QuarantinedRow, add_rows
from areal_watchdog.trajectory.replay.replay_plan import (
    ReplayHost,
    ReplayRequest,
    plan_replay_config,
)

QUIET = ("++watchdog.on_hang=cancel", "++watchdog.notify=[]")


@dataclass(frozen=True)
class Replayed:
    """One replay: which groups, how it ended, and the hang it reported, if any."""

    groups: tuple[int, ...] | None  # None: the whole batch
    exit_code: int
    seconds: float
    run_dir: str
    hang: Hang | None
    groups_of: int | None = None  # the groups came from this step (one that trained)
    error: str | None = None  # why it never started

    def as_dict(self) -> dict[str, Any]:
        return {
            "groups": None if self.groups is None else list(self.groups),
            "groups_of": self.groups_of,
            "hung": self.hang is not None,
            "hang": self.hang.describe() if self.hang else None,
            "exit_code": self.exit_code,
            "seconds": round(self.seconds, 1),
            "run_dir": self.run_dir,
            "error": self.error,
        }


@dataclass(frozen=True)
class ReplayFinding:
    """What the replays said about a hang: the policy's input (``policy.decide``)."""

    step: int | None
    same_hang: bool  # the whole step replayed and hung the same way
    note: str  # for people: what the replays showed
    replays: list[Replayed] = field(default_factory=list)
    quarantined: list[QuarantinedRow] = field(default_factory=list)
    stop: bool = False  # a resume would hang the same way again: nothing to leave out
    narrowed: dict[str, Any] | None = None  # what the bisection narrowed, for the record


class LocalReplayHost:
    """This node, in this process: the local backend."""

    where = "on this node"

    def run(self, request: ReplayRequest) -> tuple[int, str, str]:
        local = LocalBackend()
        replay = plan_replay_config(request)
        plan = local.plan(replay.config, watchdog=True)
        log = io.StringIO(replay.headline(request.run_dir))
        log.seek(0, io.SEEK_END)
        code = local.execute(plan, log)
        return code, plan.run_dir, log.getvalue()


def replay_decides(
    config: JobConfig, run_dir: Path, hang: Hang, report: dict[str, Any] | None, out: TextIO,
    host: ReplayHost | None = None,
) -> ReplayFinding | None:  # fmt: skip
    """Replay the hung step and, when it hangs the same way, bisect it and quarantine the rows
    that hang; None when the run dumped no step to replay."""
    host = host or LocalReplayHost()
    step = ((report or {}).get("trajectory") or {}).get("step")
    if not isinstance(step, int):
        return None
    replays: list[Replayed] = []

    def run(groups: tuple[int, ...] | None, groups_of: int | None = None) -> Replayed:
        try:
            replays.append(_replay(host, run_dir, step, groups, groups_of, out))
        except UserError as exc:  # a replay that cannot start tells nothing
            _say(out, f"  cannot replay: {exc}")
            replays.append(Replayed(groups, ExitCode.USAGE, 0.0, "", None, groups_of, str(exc)))
        return replays[-1]

    whole = run(None)
    if whole.hang is None or not whole.hang.within(hang):
        return ReplayFinding(step, False, _unlike(step, whole), replays)
    said = f"the dumped step {step} hangs the same way when replayed on one node"
    tokenizer = tokenizer_of(config)
    if tokenizer is None:
        return ReplayFinding(step, True, f"{said}: the hang follows the data, but {NO_TOKENIZER}",
                             replays, stop=True)  # fmt: skip
    try:
        dump_dir, count, floor = _dumped(run_dir, step)
    except (UserError, DumpError, OSError) as exc:
        said = f"{said}, but its batch cannot be read: {exc}"
        return ReplayFinding(step, True, said, replays)
    budget = config.watchdog.resume.max_replays - 1  # the whole step's replay was the first

    def trained() -> bool | None:
        return _same(run((0,), step - 1), hang)

    found = bisect(tuple(range(count)), lambda g: _same(run(g), hang), budget, floor,
                   trained if floor < count else None)  # fmt: skip
    narrowed = _narrowed(found, count)
    if found.step_keyed:
        return ReplayFinding(step, True, _step_keyed(said, step, found), replays, stop=True,
                             narrowed=narrowed)  # fmt: skip
    said = _bisected(said, step, found, count)
    try:
        rows = _quarantine(config, run_dir, dump_dir, step, found, hang, tokenizer)
    except Exception as exc:  # noqa: BLE001 - a tokenizer fails in many ways; said, not raised
        said = f"{said}; but its rows cannot be named: {_first_line(exc)}"
        return ReplayFinding(step, True, said, replays, stop=True, narrowed=narrowed)
    return ReplayFinding(step, True, said, replays, rows, narrowed=narrowed)


NO_TOKENIZER = (
    "its rows cannot be named: the config has no tokenizer_path to decode their prompts with "
    "(docs/recovery.md), so resuming would hang the same way again"
)


def tokenizer_of(config: JobConfig) -> str | None:
    """The tokenizer that decodes a dumped group's prompt: ``tokenizer_path``, else an AReaL
    actor's ``path``; None when the config names neither."""
    actor = config.raw.get("actor") if isinstance(config.raw.get("actor"), dict) else {}
    path = config.raw.get("tokenizer_path") or actor.get("path")
    return str(path) if path else None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _replay(
    host: ReplayHost, run_dir: Path, step: int, groups: tuple[int, ...] | None,
    groups_of: int | None, out: TextIO,
) -> Replayed:  # fmt: skip
    request = ReplayRequest(run_dir, step=step, overrides=QUIET, groups=groups,
                            groups_of=groups_of)  # fmt: skip
    which = "the whole batch" if groups is None else f"groups {format_ranks(groups)}"
    which += "" if groups_of is None else f" of step {groups_of}, which trained"
    _say(out, f"replaying step {step} ({which}) {host.where}, watched")
    started = time.time()
    code, replay_dir, log = host.run(request)
    if code == ExitCode.INTERRUPTED:
        raise KeyboardInterrupt  # Ctrl-C during a replay: no resume either
    with contextlib.suppress(OSError):
        (Path(replay_dir) / "areal-launch.log").write_text(log, encoding="utf-8")
    hung = code == ExitCode.HANG_CANCELLED
    incident_id, report = newest_report(RunLayout(Path(replay_dir)), started)
    hang = Hang.from_report(report, incident_id, None) if hung and report else None
    replayed = Replayed(groups, code, time.time() - started, replay_dir, hang, groups_of)
    shown = f"hung: {hang.describe()}" if hang else f"no hang (exit code {code})"
    _say(out, f"  {shown}, {replayed.seconds:.0f} s: {replay_dir}")
    return replayed


def _unlike(step: int, whole: Replayed) -> str:
    """What a replay that did not hang the same way showed."""
    if whole.hang is None and whole.exit_code != ExitCode.OK:
        where = f" ({whole.run_dir}/areal-launch.log)" if whole.run_dir else ""
        return (
            f"the replay of the dumped step {step} failed (exit code {whole.exit_code}){where}: "
            "it tells nothing, so the hang is taken as transient"
        )
    if whole.hang is None:
        return (
            f"the dumped step {step} replayed on one node without hanging (exit code "
            f"{whole.exit_code}): the hang did not follow the data, so it is taken as transient"
        )
    return (
        f"the dumped step {step} replayed on one node hangs another way ({whole.hang.describe()}),"
        " so the original hang is taken as transient"
    )


def _same(replayed: Replayed, hang: Hang) -> bool | None:
    """Whether a bisection replay hung as ``hang`` did (``Hang.within``); None when it failed
    instead."""
    if replayed.hang is None and replayed.exit_code != ExitCode.OK:
        return None
    return replayed.hang is not None and replayed.hang.within(hang)


def _dumped(run_dir: Path, step: int) -> tuple[Path, int, int]:
    """Where the step's dump is, its number of groups, and the fewest a bisection replay may
    feed: 1 when the step before was dumped (its groups pad each replay, ``--groups``), else
    all of them (AReaL's split of a batch needs a group for every data-parallel rank)."""
    from areal_watchdog.trajectory.reader import load_global_batch  # torch: only here

    plan = plan_replay_config(ReplayRequest(run_dir, step=step, overrides=QUIET))
    dump_dir = Path(plan.config.launch.env[ENV_REPLAY_DIR])
    count = len(load_global_batch(dump_dir, step))
    return dump_dir, count, 1 if step - 1 in complete_steps(dump_dir) else count


def _quarantine(
    config: JobConfig, run_dir: Path, dump_dir: Path, step: int, found: Bisection, hang: Hang,
    tokenizer: str,
) -> list[QuarantinedRow]:  # fmt: skip
    """Name the rows ``found`` in the run's quarantine file, by their prompts."""
    from areal_watchdog.trajectory.prompts import group_prompts  # torch and transformers

    prompts = group_prompts(dump_dir, step, found.groups, tokenizer)
    incident = str(hang.incident_id)
    rows = [
        QuarantinedRow(step, g, incident, p) for g, p in zip(found.groups, prompts, strict=True)
    ]
    add_rows(RunLayout(run_dir).quarantine_file, rows)
    return rows


def _narrowed(found: Bisection, total: int) -> dict[str, Any]:
    """What the bisection narrowed, for ``recovery.json`` and the report."""
    return {
        "groups": total,
        "to": list(found.groups),
        "replays": len(found.trials),
        "step_keyed": found.step_keyed,
        "unconfirmed": list(found.unconfirmed),
        "unchecked": list(found.unchecked),
    }


def _step_keyed(said: str, step: int, found: Bisection) -> str:
    return (
        f"{said}, and so did every subset down to one group in {len(found.trials) - 1} "
        f"bisection replay(s), and a group of step {step - 1}, which trained, fed as step "
        f"{step}: the hang follows the step (or the code), not the data; nothing is "
        f"quarantined, and a resume would hang again at step {step}"
    )


def _bisected(said: str, step: int, found: Bisection, total: int) -> str:
    """What the bisection found, for people: never "narrowed" when it did not."""
    said += ": the hang follows the data; "
    if total > 1 and not found.trials:
        return said + (
            f"step {step - 1} is not dumped to pad smaller replays with, so its {total} groups "
            "are quarantined whole"
        )
    why = ""
    if found.failed:
        why = f" (the replay of groups {format_ranks(found.trials[-1].groups)} failed: it tells "
        why += "nothing)"
    elif found.budget_spent:
        why = " (the replay budget, watchdog.resume.max_replays, ran out first)"
    replays = f"{len(found.trials)} bisection replay(s)"
    if len(found.groups) == total:
        reason = why or " (no smaller set hangs alone: the hang needs rows of several)"
        return said + (f"{replays} could not narrow its {total} groups{reason}; all {total} "
                       "are left out of the resumed run (quarantine.json)")  # fmt: skip
    notes = [f"groups {format_ranks(found.unconfirmed)} by elimination, never replayed alone"
             ] if found.unconfirmed else []  # fmt: skip
    if found.unchecked:
        notes.append(f"groups {format_ranks(found.unchecked)} never replayed for another")
    extra = f" ({'; '.join(notes)})" if notes else ""
    return said + (
        f"{replays} narrowed its {total} groups to group(s) {format_ranks(found.groups)}"
        f"{extra}{why}, left out of the resumed run (quarantine.json)"
    )


def _say(out: TextIO, message: str) -> None:
    print(f"[areal-launch] {message}", file=out, flush=True)
