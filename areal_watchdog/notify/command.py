"""``areal-launch notify-test`` and what every launch asks of the sinks before it starts:
their keys checked by each sink's own declaration, their secrets readable, the run's spool
flushed."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from areal_watchdog.common.errors import UserError
from areal_watchdog.common.secrets.redact import Redactor
from areal_watchdog.config.load import load_config
from areal_watchdog.config.model import JobConfig
from areal_watchdog.config.sinks import SecretError, SinkSpec, resolve, secret_values
from areal_watchdog.notify.delivery import delivery_id, send
from areal_watchdog.notify.envelope import encode
from areal_watchdog.notify.notifier import deliver_spooled, render
from areal_watchdog.notify.sinks.registry import checked, sink_for
from areal_watchdog.report.sample import sample_report
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.secure import check_run_dir, private_dir_problem

JOB_FAILED = 1  # ExitCode.JOB_FAILED: a sink did not take the sample


def config_sinks(config: JobConfig) -> list[SinkSpec]:
    """The config's sinks, each checked by its own declaration (raises ConfigError)."""
    return checked(config.watchdog.notify, config.source)


def check_sinks(config: JobConfig) -> None:
    """Refuse to start a watched job whose notification secrets cannot be read."""
    for spec in config_sinks(config):
        try:
            resolve(spec)
        except SecretError as exc:
            raise UserError(f"{config.source}: watchdog.notify: {exc}") from None


def flush_spool(run_dir: str, log: Callable[[str], None] = print) -> None:
    """Deliver notifications an earlier run could not send: only from a run directory of ours
    and a spool nobody else could have written (we sign and send what it holds). A launch into
    a directory that is not ours says why when it refuses it, right after."""
    try:
        spool = RunLayout(check_run_dir(Path(run_dir))).spool_dir
    except UserError:
        return
    if not (spool.exists() or spool.is_symlink()):
        return
    problem = private_dir_problem(spool)
    if problem:
        log(f"[areal-launch] spool {spool} not flushed: {problem}")
        return
    sent, left = deliver_spooled(spool, log)
    if sent or left:
        log(f"[areal-launch] spooled notifications: {sent} delivered, {left} still pending")


def cmd_notify_test(argv: list[str], _watchdog: bool) -> int:
    parser = argparse.ArgumentParser(
        prog="areal-launch notify-test",
        description="Send a realistic sample report to every sink in watchdog.notify.",
    )
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_intermixed_args(argv)
    config = load_config(args.config, args.overrides)
    specs = config_sinks(config)
    if not specs:
        raise UserError(f"{config.source}: watchdog.notify lists no sink to test")
    report = sample_report(config)
    redactor = Redactor.from_environment(extra=secret_values(specs))
    failures = 0
    for spec in specs:
        try:
            sink = resolve(spec)
        except SecretError as exc:
            print(f"{spec.name} ({spec.type}): not sent: {exc}")
            failures += 1
            continue
        kind = sink_for(spec)
        message_id = delivery_id(report["incident_id"], spec)
        outcome = send(sink, render(spec, report), message_id, redactor)
        print(f"{spec.name} ({spec.type}): {outcome.describe()}")
        failures += not outcome.delivered
        closing = kind.resolution(report, "notify-test") if outcome.delivered else None
        if closing is not None:  # a test page is closed at once
            done = send(sink, encode(closing), f"{message_id}-resolve", redactor)
            print(f"{spec.name} ({spec.type}): resolved the sample: {done.describe()}")
    return JOB_FAILED if failures else 0
