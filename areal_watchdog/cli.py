"""``areal-launch``: launch a job (with ``--watchdog``), and work with its run directory.

    areal-launch [--watchdog] local CONFIG [key=value ...] [--dry-run]

Exit codes: 0 completed, 1 the job failed, 2 bad usage or configuration, 3 a hang was detected
and the job cancelled (``watchdog.on_hang: cancel``), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from areal_watchdog.config import load_config
from areal_watchdog.errors import UserError
from areal_watchdog.local_backend import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    build_local_plan,
    execute_local_plan,
)

COMMANDS = ("local",)


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
    parser.add_argument("--watchdog", action="store_true", help="start the watchdog sidecar")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (commands, environment, files) and start nothing",
    )
    return parser


def cmd_local(argv: list[str], watchdog: bool) -> int:
    args = _launch_parser("local").parse_intermixed_args(argv)
    config = load_config(args.config, args.overrides)
    enabled = watchdog or args.watchdog or config.watchdog.enabled
    plan = build_local_plan(config, enabled)
    if args.dry_run:
        print(plan.render())
        return 0
    return execute_local_plan(plan)


HANDLERS: dict[str, Callable[[list[str], bool], int]] = {"local": cmd_local}


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
    top.add_argument("command", choices=COMMANDS)
    top.add_argument("rest", nargs=argparse.REMAINDER)
    args = top.parse_args(argv)
    try:
        return HANDLERS[args.command](args.rest, args.watchdog)
    except UserError as exc:
        print(f"areal-launch: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
