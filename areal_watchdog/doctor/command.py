"""``areal-launch doctor [CONFIG] [overrides] [--slurm]``: every check for this node, or, inside
a Slurm allocation, for every node of it; one table, exit 0 when nothing fails, 1 when something
does, 2 for bad usage or a bad config."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

from areal_watchdog.common.errors import UserError
from areal_watchdog.config.debug_env import DEFAULT_DEBUG_ENV
from areal_watchdog.config.load import load_config
from areal_watchdog.config.model import JobConfig
from areal_watchdog.doctor import slurm
from areal_watchdog.doctor.checks.clients import check_ray, check_slurm
from areal_watchdog.doctor.checks.filesystem import existing_ancestor
from areal_watchdog.doctor.model import PASS, Check, NodeSpec, failed
from areal_watchdog.doctor.node import run_node
from areal_watchdog.doctor.render import merge, render
from areal_watchdog.notify.sinks.registry import checked


def spec_from(config: JobConfig | None) -> NodeSpec:
    """What every node checks: the config's interpreter, fileroot, GPUs and sinks."""
    if config is None:
        return NodeSpec(sys.executable, os.getcwd(), debug_env=dict(DEFAULT_DEBUG_ENV))
    wd = config.watchdog
    return NodeSpec(
        config.launch.python,
        config.fileroot,
        wd.gpu.backend,
        wd.gpu.recording,
        config.n_gpus_per_node,
        dict(wd.debug_env),
        wd.flight_recorder,
        "rollout" in config.raw,
        list(wd.notify),
    )


def slurm_backend(config: JobConfig | None) -> bool:
    """The config runs on Slurm: AReaL's ``scheduler.type: slurm`` or a ``launch.slurm``."""
    if config is None:
        return False
    scheduler = config.raw.get("scheduler")
    kind = scheduler.get("type") if isinstance(scheduler, dict) else None
    return kind == "slurm" or bool(config.launch.slurm)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="areal-launch doctor",
        description="Check that the watchdog can take its evidence here (or on every node of "
        "a Slurm allocation): pass / warn / fail, each with its fix.",
    )
    parser.add_argument("config", nargs="?", help="the job's config (default: this machine's)")
    parser.add_argument("overrides", nargs="*", help="Hydra-style overrides: key=value")
    parser.add_argument(
        "--slurm", action="store_true", help="check every node of this Slurm allocation (srun)"
    )
    return parser


def cmd_doctor(argv: list[str], _watchdog: bool) -> int:
    args = _parser().parse_intermixed_args(argv)
    if args.overrides and args.config is None:
        raise UserError("doctor: overrides need a CONFIG before them")
    config = load_config(args.config, args.overrides) if args.config else None
    if config is not None:
        checked(config.watchdog.notify, config.source)
    spec = spec_from(config)
    if args.slurm and not slurm.in_allocation():
        raise UserError(
            "doctor --slurm: SLURM_JOB_ID is not set: run it inside an allocation "
            "(salloc -N 2 areal-launch doctor --slurm CONFIG)"
        )
    if args.slurm or (slurm_backend(config) and slurm.in_allocation()):
        return _every_node(spec, config)
    return _this_node(spec, slurm_backend(config))


def _this_node(spec: NodeSpec, slurm_config: bool) -> int:
    report = run_node(spec)
    checks = [*report.checks, check_slurm(), check_ray(), Check("clock skew", PASS, "single node")]
    title = f"areal-launch doctor: node {report.node}"
    if slurm_config:
        title += " only (run it inside an allocation, salloc -N N, to check every node)"
    print(render([(c, [report.node]) for c in checks], 1, title))
    return 1 if failed(checks) else 0


def _every_node(spec: NodeSpec, config: JobConfig | None) -> int:
    nodes = slurm.allocated_nodes(dict(os.environ))
    where = existing_ancestor(spec.probe_dir)
    try:
        shared = tempfile.mkdtemp(prefix=".areal-doctor-", dir=where)
    except OSError as exc:
        raise UserError(f"cluster.fileroot: cannot write in {where}: {exc.strerror}") from None
    try:
        node_spec = NodeSpec.from_dict({**spec.to_dict(), "shared_dir": shared})
        command = slurm.srun_command(node_spec, nodes, config.launch.slurm if config else {})
        reports, missing = slurm.run_step(command, nodes)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    launcher = [check_slurm(), check_ray()]
    rows = [*merge(reports), *[(c, ["launcher"]) for c in [*missing, *launcher]]]
    rows.append((slurm.skew_check(reports), [r.node for r in reports]))
    job = os.environ.get("SLURM_JOB_ID", "?")
    print(render(rows, nodes, f"areal-launch doctor: {len(reports)} node(s) of job {job}"))
    return 1 if failed([c for c, _ in rows]) else 0
