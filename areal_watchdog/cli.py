"""``areal-launch``: launch a job (with ``--watchdog``), and work with its run directory.

    areal-launch [--watchdog] local CONFIG [key=value ...] [--dry-run]
    areal-launch [--watchdog] slurm CONFIG [key=value ...] [--dry-run] [--wait]
    areal-launch [--watchdog] ray CONFIG [key=value ...] [--dry-run]
    areal-launch status RUN_DIR_OR_JOB_ID
    areal-launch cancel RUN_DIR_OR_JOB_ID
    areal-launch replay RUN_DIR [--step N | --from N --to M] [--nproc K] [--dry-run]
    areal-launch notify-test CONFIG [key=value ...]
    areal-launch diagnose PATH [--json]
    areal-launch doctor [CONFIG] [key=value ...] [--slurm]
    areal-launch check-consistency RUN_DIR [--steps 0,2-3] [--weights DIR] [--plot FILE]
    areal-launch check-workflow CONFIG [key=value ...] [--server HOST:PORT] [--timeout S]

Exit codes: 0 completed (after resumes too), 1 the job failed, 2 bad usage or configuration,
3 a hang was detected and the job cancelled (``watchdog.on_hang: cancel``, or ``resume`` gave
up), 4 cancelled by someone (``slurm --wait``), 5 Slurm time limit (``slurm --wait``), 130
interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from areal_watchdog.common.areal_version import installed_version
from areal_watchdog.common.errors import UserError
from areal_watchdog.common.rankset import format_ranks, parse_ranks
from areal_watchdog.config.areal_side.preflight import preflight
from areal_watchdog.config.load import load_config
from areal_watchdog.config.model import HangAction, JobConfig, WatchdogSection
from areal_watchdog.config.reading.keys import declared
from areal_watchdog.diagnose.classify import classify
from areal_watchdog.diagnose.render import verdict_dict, verdict_text
from areal_watchdog.doctor.command import cmd_doctor
from areal_watchdog.doctor.hint import with_doctor_hint
from areal_watchdog.evidence import offline
from areal_watchdog.launch.backend import backend_class, backend_names, resolve_target
from areal_watchdog.launch.exit_codes import ExitCode
from areal_watchdog.launch.local import LocalBackend
from areal_watchdog.notify.command import check_sinks, cmd_notify_test, config_sinks, flush_spool
from areal_watchdog.notify.sinks.registry import key_lines
from areal_watchdog.recover.checks import check_resumable, resume_notes, tokenizer_warning
from areal_watchdog.recover.resume import recovery_lines, run_resuming
from areal_watchdog.report.build import load_schema
from areal_watchdog.report.run_status import status_lines
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.trajectory.replay.replay_plan import ReplayRequest, plan_replay_config

COMMANDS = (
    "status",
    "cancel",
    "replay",
    "notify-test",
    "keys",
    "schema",
    "diagnose",
    "doctor",
    "check-consistency",
    "check-workflow",
)


def _launch_parser(backend: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"areal-launch [--watchdog] {backend}",
        description=f"Launch CONFIG on the {backend} backend.",
    )
    parser.add_argument("config", help="AReaL-style YAML config")
    parser.add_argument(
        "overrides",
        nargs="*",
        help="Hydra-style overrides: key=value, +key=value (add), ~key (delete)",
    )
    _switches(
        parser,
        watchdog="start the watchdog sidecar",
        dry_run="print the plan (commands, environment, files) and start nothing",
        ignore_preflight="launch even if the config has a trap that will hang it "
        "(docs/configuration.md)",
    )
    return parser


def _switches(parser: argparse.ArgumentParser, **helps: str) -> None:
    """On/off options, named as their ``dest`` (``dry_run`` is ``--dry-run``)."""
    for dest, text in helps.items():
        parser.add_argument(f"--{dest.replace('_', '-')}", action="store_true", help=text)


def run_preflight(config: JobConfig, watchdog: bool, ignore: bool) -> None:
    """Say every AReaL config trap; refuse to launch on a real one unless told to go on."""
    wd = config.watchdog
    threshold = "an automatic threshold" if wd.stall_timeout is None else f"{wd.stall_timeout:g} s"
    areal = installed_version(config.launch.python) if "rollout" in config.raw else None
    findings = preflight(config.raw, watchdog, threshold, areal)
    for finding in findings:
        level = "warning" if finding.level == "warning" or ignore else "error"
        print(f"[areal-launch] {level}: {finding.line(config.source)}", file=sys.stderr)
    if any(f.level == "error" for f in findings) and not ignore:
        raise UserError(
            f"{config.source}: the config would hang (see above); fix it, or pass "
            "--ignore-preflight to launch anyway"
        )


def cmd_launch(name: str, argv: list[str], watchdog: bool) -> int:
    """``local``, ``slurm`` and ``ray``: one path for every backend, the dry run included."""
    parser = _launch_parser(name)
    kind = backend_class(name)
    kind.add_arguments(parser)
    args = parser.parse_intermixed_args(argv)
    config = load_config(args.config, args.overrides)
    config_sinks(config)
    enabled = watchdog or args.watchdog or config.watchdog.enabled
    run_preflight(config, enabled, args.ignore_preflight)
    target = kind.from_args(args)
    plan = target.plan(config, enabled)
    resuming = enabled and config.watchdog.on_hang is HangAction.RESUME
    if resuming:
        check_resumable(config, target.recovery, plan.mode)
        warning = tokenizer_warning(config, plan.mode)
        if warning:
            print(f"[areal-launch] warning: {warning}", file=sys.stderr)
        plan = replace(plan, notes=[*plan.notes, *resume_notes(config, plan.mode, target.recovery)])
    if args.dry_run:
        print(with_doctor_hint(plan, config, enabled).render())
        return 0
    if enabled:
        check_sinks(config)
    flush_spool(plan.run_dir)
    if resuming:
        return run_resuming(target, config, plan, sys.stdout)
    return target.execute(plan, sys.stdout)


def _target(command: str, description: str, argv: list[str]) -> str:
    """``RUN_OR_HANDLE`` as given."""
    parser = argparse.ArgumentParser(prog=f"areal-launch {command}", description=description)
    parser.add_argument(
        "target", help="a run directory, a Slurm job id, or a handle: slurm://ID, local://RUN_DIR"
    )
    return parser.parse_args(argv).target


def cmd_status(argv: list[str], _watchdog: bool) -> int:
    parser = argparse.ArgumentParser(
        prog="areal-launch status",
        description="The job's state, slow or hung (with its own step times), and what each "
        "node's sidecar saw.",
    )
    parser.add_argument(
        "target", help="a run directory, a Slurm job id, or a handle: slurm://ID, local://RUN_DIR"
    )
    parser.add_argument(
        "--watch", type=float, nargs="?", const=2.0, metavar="SECONDS",
        help="show it again every SECONDS (2 by default) until interrupted",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.watch is not None and args.watch <= 0:
        raise UserError(f"--watch takes a positive number of seconds, got {args.watch:g}")
    kind, handle = resolve_target(args.target)
    while True:
        described = kind.describe(handle)
        for line in described.lines:
            print(line)
        if described.run_dir is not None:
            _show_run(described.run_dir, described.note)
        if args.watch is None:
            return 0
        sys.stdout.flush()
        time.sleep(args.watch)
        print(f"\n-- {time.strftime('%H:%M:%S')} --")


def _show_run(run_dir: Path, kind: str) -> None:
    """What each node's sidecar saw, the newest incidents and the resumes."""
    print(f"run dir: {run_dir}{kind}")
    flush_spool(str(run_dir))
    for line in [*status_lines(run_dir, time.time()), *recovery_lines(run_dir)]:
        print(line)


def cmd_cancel(argv: list[str], _watchdog: bool) -> int:
    target = _target("cancel", "End a run (Slurm: scancel); its run directory stays.", argv)
    kind, handle = resolve_target(target)
    print(kind.cancel(handle))
    return 0


def _groups(text: str) -> tuple[int, ...]:
    try:
        return parse_ranks(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list like 0,2-3") from None


def cmd_replay(argv: list[str], _watchdog: bool) -> int:
    parser = argparse.ArgumentParser(
        prog="areal-launch replay",
        description="Replay dumped training steps of RUN_DIR on this node, without rollout.",
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("overrides", nargs="*", help="Hydra-style overrides for the replay")
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--step",
        type=int,
        help="replay this step (default: the newest step dumped before the newest incident)",
    )
    which.add_argument("--from", dest="first", type=int, help="first step of a range")
    parser.add_argument("--to", dest="last", type=int, help="last step of a range")
    parser.add_argument(
        "--nproc",
        type=int,
        help="ranks (default: the recorded DP size); batches are re-split deterministically",
    )
    parser.add_argument(
        "--groups",
        type=_groups,
        help="only these groups (rows) of the step's batch, e.g. 0,2-3, padded with the groups "
        "of the step before, which trained (what a bisection does)",
    )
    parser.add_argument(
        "--groups-of",
        type=int,
        help="take --groups from this dumped step's batch, fed as --step (a bisection replays "
        "groups of the step before, which trained, to tell a hang keyed on the step)",
    )
    _switches(
        parser,
        dry_run="print the plan, start nothing",
        unsafe_load="allow full unpickling of dump files (only for dumps you trust)",
        allow_config_change="replay even if the config differs from the recording's",
    )
    args = parser.parse_intermixed_args(argv)
    if args.last is not None and args.step is not None:
        parser.error("--to goes with --from, not with --step")
    if args.groups_of is not None and args.groups is None:
        parser.error("--groups-of goes with --groups")
    if args.nproc is not None and args.nproc < 1:
        parser.error("--nproc must be at least 1")
    request = ReplayRequest(
        args.run_dir,
        args.step,
        args.first,
        args.last,
        args.nproc,
        args.unsafe_load,
        args.allow_config_change,
        tuple(args.overrides),
        args.groups,
        args.groups_of,
    )
    replay = plan_replay_config(request)
    config, steps = replay.config, replay.steps
    local = LocalBackend()
    plan = local.plan(config, watchdog=True)
    weights = f"weights:   {replay.weights}\n" if replay.weights else ""
    if args.dry_run:
        print(f"replaying step(s) {format_ranks(steps)} of {args.run_dir}\n{weights}")
        print(plan.render())
        return 0
    check_sinks(config)
    flush_spool(str(RunLayout(args.run_dir).run_dir))
    print(replay.headline(args.run_dir), end="", flush=True)
    return local.execute(plan, sys.stdout)


def cmd_keys(argv: list[str], _watchdog: bool) -> int:
    parser = argparse.ArgumentParser(
        prog="areal-launch keys",
        description="Every watchdog key: its type, default and meaning (docs/configuration.md), "
        "and each sink type's keys (docs/notifications.md).",
    )
    parser.add_argument("prefix", nargs="?", default="", help="only keys that start with this")
    args = parser.parse_args(argv)
    lines = [d.line() for d in declared(WatchdogSection, "watchdog")] + key_lines()
    print("\n".join(line for line in lines if line.startswith(args.prefix)))
    return ExitCode.OK


def cmd_schema(argv: list[str], _watchdog: bool) -> int:
    argparse.ArgumentParser(
        prog="areal-launch schema",
        description="The JSON Schema of report.json, the hang kinds' names included "
        "(docs/report-schema.md).",
    ).parse_args(argv)
    print(json.dumps(load_schema(), indent=2))
    return ExitCode.OK


def cmd_diagnose(argv: list[str], _watchdog: bool) -> int:
    parser = argparse.ArgumentParser(
        prog="areal-launch diagnose",
        description="Classify a hang after the fact: Flight Recorder dumps or an incident.",
    )
    parser.add_argument("path", type=Path, help="a directory of per-rank dumps, or an incident")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    found = offline.load(args.path)
    verdict = classify(found.evidence)
    source = {"path": str(args.path), "kind": found.source, "files": found.files}
    print(json.dumps(verdict_dict(verdict, source)) if args.json else verdict_text(verdict))
    return 0


def cmd_check_consistency(argv: list[str], watchdog: bool) -> int:
    """Imported when asked for: it loads torch and transformers."""
    from areal_watchdog.trajectory.rollout_consistency.check_consistency import (
        cmd_check_consistency as run,
    )

    return run(argv, watchdog)


def cmd_check_workflow(argv: list[str], watchdog: bool) -> int:
    """Imported when asked for, as the command it wraps."""
    from areal_watchdog.workflow_check.command import cmd_check_workflow as run

    return run(argv, watchdog)


HANDLERS: dict[str, Callable[[list[str], bool], int]] = {
    "status": cmd_status,
    "cancel": cmd_cancel,
    "replay": cmd_replay,
    "notify-test": cmd_notify_test,
    "keys": cmd_keys,
    "schema": cmd_schema,
    "diagnose": cmd_diagnose,
    "doctor": cmd_doctor,
    "check-consistency": cmd_check_consistency,
    "check-workflow": cmd_check_workflow,
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``areal-launch`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    top = argparse.ArgumentParser(
        prog="areal-launch",
        description=__doc__.splitlines()[0],
        epilog="Run 'areal-launch COMMAND --help' for a command's options.",
    )
    top.add_argument(
        "--watchdog", action="store_true", help="start a watchdog sidecar on every node of the job"
    )
    backends = backend_names()
    top.add_argument("command", choices=[*backends, *COMMANDS])
    top.add_argument("rest", nargs=argparse.REMAINDER)
    args = top.parse_args(argv)
    try:
        if args.command in backends:
            return cmd_launch(args.command, args.rest, args.watchdog)
        return HANDLERS[args.command](args.rest, args.watchdog)
    except UserError as exc:
        print(f"areal-launch: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
