"""``areal-launch check-workflow CONFIG [overrides] [--server URL]``: the config's training
script's workflow and reward against a persistent inference server, in AReaL's guide's three
stages, each bounded in time. Exit 0 when every stage passed, 1 when one did not, 2 for bad
input (one line). Everything it wrote (the config the script read, the probe's and the server's
logs, ``result.json``) stays in ``--out``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

import yaml

from areal_watchdog.common.atomic import open_append, read_json, write_text_atomic
from areal_watchdog.common.errors import ConfigError, UserError
from areal_watchdog.config.areal_side.entrypoint import resolve_entrypoint
from areal_watchdog.config.load import load_config
from areal_watchdog.config.model import JobConfig
from areal_watchdog.launch.planning.job import stored_config
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.secure import ensure_run_dir
from areal_watchdog.trajectory.replay.replay_plan import dump_dir
from areal_watchdog.workflow_check.model import CheckResult
from areal_watchdog.workflow_check.probe import MARK
from areal_watchdog.workflow_check.render import render
from areal_watchdog.workflow_check.server import (
    Server,
    given_server,
    last_line,
    started_vllm,
)

DEFAULT_LIMIT = 300.0  # seconds per stage: an agent's episode with tools can take minutes
IMPORT_ALLOWANCE = 600.0  # seconds for the script up to PPOTrainer.train (imports, dataset)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="areal-launch check-workflow",
        description="Run the config's workflow and reward against a persistent inference "
        "server: one episode, one batch at the training's concurrency, then AReaL's rollout "
        "engine with the config's staleness settings (AReaL's debugging guide, steps 2-4).",
    )
    parser.add_argument("config", help="the job's config (its launch.entrypoint names the script)")
    parser.add_argument("overrides", nargs="*", help="Hydra-style overrides: key=value")
    parser.add_argument(
        "--server", help="host:port of a running server (default: start vLLM from actor.path)"
    )
    parser.add_argument(
        "--server-python", help="the interpreter whose vLLM to start (default: launch.python)"
    )
    parser.add_argument(
        "--server-arg", action="append", default=[], metavar="ARG",
        help="one more flag for the vLLM it starts (repeat: --server-arg=--enforce-eager)",
    )  # fmt: skip
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_LIMIT,
        help=f"seconds each stage may take (default {DEFAULT_LIMIT:g})",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="where to keep logs and result.json "
                        "(default: <fileroot>/<experiment>/<trial>/check-workflow)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return parser


def cmd_check_workflow(argv: list[str], _watchdog: bool) -> int:
    args = _parser().parse_intermixed_args(argv)
    if args.timeout <= 0:
        raise UserError(f"--timeout {args.timeout:g}: give a number of seconds above 0")
    config = load_config(args.config, args.overrides)
    if not isinstance(config.raw.get("rollout"), dict):
        raise ConfigError(config.source, "rollout", "no AReaL rollout section: check-workflow "
                          "runs the workflow of an AReaL training script")  # fmt: skip
    entry = resolve_entrypoint(config)
    out = (args.out or config.run_dir / "check-workflow").resolve()
    # ours alone, as a run directory: it holds the logs, the script's config and a request the
    # probe acts on, and check-consistency reads it as a run
    ensure_run_dir(out, out.parent, 0o700)
    with _server(args, config, out) as server:
        result = run_probe(config, entry, server, args.timeout, out)
    if result.error:
        raise UserError(f"{config.source}: {result.error} (log: {out / 'probe.log'})")
    where = f"{server.address}, {server.origin}"
    print(json.dumps({**result.to_dict(), "server": where}) if args.json else render(result, where))
    sys.stdout.flush()
    print(f"logs and result.json: {out}", file=sys.stderr)
    return 0 if result.passed else 1


def _server(args: argparse.Namespace, config: JobConfig, out: Path):  # noqa: ANN202
    if args.server:
        return contextlib.nullcontext(given_server(args.server))
    python = args.server_python or config.launch.python
    return started_vllm(config, python, args.server_arg, out / "server.log")


def run_probe(
    config: JobConfig, entry: str, server: Server, limit: float, out: Path
) -> CheckResult:
    """The script in ``launch.python`` with the check in place of training; its progress lines
    shown, the rest of its output in ``probe.log``; its process group ended after it."""
    script_config = out / "config.yaml"
    write_text_atomic(script_config, yaml.safe_dump(config.job_tree(), sort_keys=False))
    result_path = out / "result.json"
    result_path.unlink(missing_ok=True)
    _as_run_dir(config, out)
    request = {
        "entry": entry, "server": server.address, "engine": server.engine, "limit": limit,
        "result": str(result_path), "dump": str(dump_dir(config, out) / "step_000000_dp_0.pt"),
        "args": [*config.launch.args, config.launch.config_arg or "--config", str(script_config)],
    }  # fmt: skip
    write_text_atomic(out / "request.json", json.dumps(request))
    argv = [config.launch.python, "-m", "areal_watchdog.workflow_check.probe",
            str(out / "request.json")]  # fmt: skip
    _follow(
        argv, {**os.environ, **config.launch.env}, out / "probe.log", 3 * limit + IMPORT_ALLOWANCE
    )
    found = read_json(result_path)
    if not isinstance(found, dict):
        raise UserError(f"the check ended without a result: {last_line(out / 'probe.log')} "
                        f"(log: {out / 'probe.log'})")  # fmt: skip
    return CheckResult.from_dict(found)


def _as_run_dir(config: JobConfig, out: Path) -> None:
    """``out`` as a run directory holds its config, so that ``check-consistency OUT`` reads the
    engine's batch (stage 3) as a dumped step 0, scored with the config's weights."""
    write_text_atomic(RunLayout(out).launch_config, stored_config(config))
    shutil.rmtree(dump_dir(config, out), ignore_errors=True)


def _follow(argv: list[str], env: dict[str, str], log: Path, deadline: float) -> None:
    """Run the probe, its progress lines echoed and every line logged; end its whole process
    group once it exits (a stuck episode's tools and AReaL's reward processes are in it, and
    hold its output open), or at ``deadline`` s."""
    log.unlink(missing_ok=True)
    with open_append(log) as sink:
        probe = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)  # fmt: skip
        reader = threading.Thread(target=_echo, args=(probe.stderr, sink), daemon=True)
        reader.start()
        try:
            probe.wait(deadline)
        except subprocess.TimeoutExpired:
            pass
        finally:
            _end_group(probe.pid)
            probe.wait()
            reader.join(10)


def _echo(lines: Iterable[str], sink: TextIO) -> None:
    for line in lines:
        sink.write(line)
        if line.startswith(MARK):
            print(line.rstrip(), flush=True)


def _end_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
