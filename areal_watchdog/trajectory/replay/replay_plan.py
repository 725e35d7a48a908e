"""Plan ``areal-launch replay RUN_DIR``: the same entrypoint on this node, fed from the dump.

The replay starts from the run's own resolved config (``watchdog/launch_config.yaml``) under a
new trial name (``<trial>_replay<step>``), so the original run's checkpoints and logs are never
touched; rollout is bypassed (our ``Replay`` API in a script written for it, our hook of
AReaL's trainer in an AReaL experiment, ``rank.areal_hooks.areal_trajectory``), and the watchdog
runs as in the original job.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

from areal_watchdog.common.atomic import read_json
from areal_watchdog.common.errors import UserError
from areal_watchdog.common.rankset import format_ranks
from areal_watchdog.common.secrets.redact import REDACTED
from areal_watchdog.config.areal_side.areal import parse_allocation
from areal_watchdog.config.areal_side.entrypoint import launch_mode
from areal_watchdog.config.load import load_config
from areal_watchdog.config.model import HangAction, JobConfig
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.secure import check_run_dir
from areal_watchdog.trajectory.format import (
    ENV_CONFIG_HASH,
    ENV_REPLAY_DIR,
    ENV_REPLAY_GROUPS,
    ENV_REPLAY_GROUPS_OF,
    ENV_REPLAY_PAD_STEP,
    ENV_REPLAY_PAD_TO,
    ENV_REPLAY_SOURCE,
    ENV_REPLAY_STEPS,
    ENV_REPLAY_UNSAFE,
    ENV_REPLAY_VERIFIED,
    check_file,
    complete_steps,
    config_hash,
    read_manifest,
    step_problems,
)
from areal_watchdog.trajectory.replay.areal_replay import areal_replay


@dataclass(frozen=True)
class ReplayRequest:
    """What the user asked for on the command line."""

    run_dir: Path
    step: int | None = None
    first: int | None = None
    last: int | None = None
    nproc: int | None = None
    unsafe_load: bool = False
    allow_config_change: bool = False
    overrides: tuple[str, ...] = ()
    groups: tuple[int, ...] | None = None  # only these groups of the step's global batch
    groups_of: int | None = None  # ... of this step's batch instead (one that trained)


class ReplayHost(Protocol):
    """Where a replay runs."""

    where: str

    def run(self, request: ReplayRequest) -> tuple[int, str, str]:
        """The replay to its end: (its exit code, its run directory, its terminal output)."""
        ...


def incident_time(layout: RunLayout) -> float | None:
    """When the newest incident of the run was detected."""
    reports = sorted(layout.incidents_dir.glob("*/report.json"))
    for path in reversed(reports):
        report = read_json(path)
        if isinstance(report, dict) and report.get("detected_at"):
            return datetime.fromisoformat(report["detected_at"]).timestamp()
    return None


def choose_steps(
    request: ReplayRequest, available: dict[int, list[Path]], before: float | None, dumps: Path
) -> list[int]:
    """The steps to replay; by default the newest step dumped before the newest incident."""
    listing = format_ranks(sorted(available)) or "none"
    if request.step is not None:
        wanted = [request.step]
    elif request.first is not None or request.last is not None:
        first = request.first if request.first is not None else min(available, default=0)
        last = request.last if request.last is not None else max(available, default=0)
        if last < first:
            raise UserError(f"--from {first} --to {last}: the range is empty")
        if available and last > max(available):
            raise UserError(
                f"--to {last}: past the newest dumped step {max(available)} (dumped steps: "
                f"{listing}); leave --to out to replay to the end"
            )
        wanted = list(range(first, last + 1))
    else:
        candidates = [
            s
            for s, files in available.items()
            if before is None
            or all((read_manifest(f) or {}).get("created", 0) <= before for f in files)
        ]
        if not candidates:
            raise UserError(f"no step was dumped before the incident (dumped steps: {listing})")
        wanted = [max(candidates)]
    missing = [s for s in wanted if s not in available]
    problems = [p for s in missing for p in step_problems(dumps, s)]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UserError(f"cannot replay: {problems[0]}{more}")
    if missing:
        raise UserError(
            f"step(s) {format_ranks(missing)} not in the dump (complete steps: {listing})"
        )
    return wanted


@dataclass(frozen=True)
class ReplayConfig:
    """The replay run's config (our env and overrides applied), the steps it replays and, for
    an AReaL run, where its weights come from."""

    config: JobConfig
    steps: list[int]
    weights: str | None = None

    @property
    def trainers(self) -> str:
        """Who trains, for people: "2 ranks", or an AReaL run's actor allocation."""
        actor = self.config.raw.get("actor")
        if self.weights is not None and isinstance(actor, dict):
            return f"actor {actor.get('backend')}"
        nproc = self.config.launch.nproc_per_node
        return f"{nproc} rank{'' if nproc == 1 else 's'}"

    def headline(self, run_dir: Path | str) -> str:
        """What a replay says first, on the terminal and at the top of its log: which steps of
        which run, as which trial, and whose weights."""
        said = (
            f"[areal-launch] replaying step(s) {format_ranks(self.steps)} of {run_dir} as trial "
            f"{self.config.trial_name} ({self.trainers}, rollout bypassed)\n"
        )
        return said + (f"[areal-launch] replay weights: {self.weights}\n" if self.weights else "")


def plan_replay_config(request: ReplayRequest) -> ReplayConfig:
    """The replay run's config, steps and weights."""
    if not request.run_dir.is_dir():
        raise UserError(f"{request.run_dir}: no such run directory")
    layout = RunLayout(check_run_dir(request.run_dir))
    if not layout.launch_config.is_file():
        raise UserError(
            f"{request.run_dir}: not a run directory made by areal-launch "
            f"(no {layout.launch_config.relative_to(layout.run_dir)})"
        )
    original = load_config(layout.launch_config)
    dumps = dump_dir(original, layout.run_dir)
    available = complete_steps(dumps)
    if not available:
        raise UserError(
            f"{dumps}: no complete trajectory dump; dumping is on by default "
            "with --watchdog (watchdog.trajectory.enabled) and needs the training "
            "script to record its batches (areal_watchdog.trajectory)"
        )
    steps = choose_steps(request, available, incident_time(layout), dumps)
    from areal_watchdog.trajectory.reader import loadable_problem  # torch: only for a replay

    manifests = []
    for step in steps:
        for path in available[step]:
            problem = check_file(path) or loadable_problem(path, request.unsafe_load)
            if problem:
                raise UserError(f"cannot replay step {step}: {problem}")
            manifests.append(read_manifest(path) or {})
    recorded_dp = max(int(m.get("dp_size") or 1) for m in manifests)
    if request.groups is not None:
        fed = _fed_manifests(request, steps, available, manifests)
        _check_groups(request, steps, sum(int(m.get("groups") or 0) for m in fed))
    trial = _new_trial(original, steps, request.groups, request.groups_of)
    env = {
        ENV_REPLAY_DIR: str(dumps),
        ENV_REPLAY_STEPS: ",".join(map(str, steps)),
        ENV_REPLAY_SOURCE: str(layout.run_dir),
        ENV_REPLAY_VERIFIED: "1",
    }
    if request.unsafe_load:
        env[ENV_REPLAY_UNSAFE] = "1"
    if request.groups is not None:
        env[ENV_REPLAY_GROUPS] = ",".join(map(str, sorted(set(request.groups))))
        if request.groups_of is not None:
            env[ENV_REPLAY_GROUPS_OF] = str(request.groups_of)
        if steps[0] - 1 in available:
            env[ENV_REPLAY_PAD_STEP] = str(steps[0] - 1)
            env[ENV_REPLAY_PAD_TO] = str(_data_parallel(original, request.nproc, recorded_dp))
    if request.allow_config_change:
        env[ENV_CONFIG_HASH] = ""
    overrides = [
        f"trial_name={trial}",
        f"++launch.nproc_per_node={request.nproc or recorded_dp}",
        "++watchdog.trajectory.enabled=false",
    ]
    if (
        original.watchdog.on_hang is HangAction.RESUME
    ):  # a replay that hangs ends there: nothing resumes it
        overrides.append("++watchdog.on_hang=cancel")
    overrides += [f"++launch.env.{name}={value}" for name, value in env.items()]
    overrides += unstored_secrets(original, layout.launch_config)
    weights, resharding = None, []
    if launch_mode(original) != "torchrun":
        areal = areal_replay(original, trial, steps, request.nproc)
        overrides += areal.overrides
        weights, resharding = areal.weights, areal.resharding
    if isinstance(original.raw.get("trajectory_debug"), dict):
        overrides += [
            "++trajectory_debug.replay_rollout_data=true",
            "++trajectory_debug.dump_rollout_data=false",
            f"++trajectory_debug.path={dumps}",
        ]
    config = load_config(layout.launch_config, [*overrides, *request.overrides])
    recorded_hash = next((m.get("config_hash") for m in manifests if m.get("config_hash")), None)
    if recorded_hash and not request.allow_config_change:
        replay_hash = config_hash(config.raw)
        if recorded_hash != replay_hash:
            raise UserError(
                f"{available[steps[0]][0]}: recorded with another config (hash "
                f"{recorded_hash}, the replay's {replay_hash}); drop the "
                "overrides that change the model or data, or pass --allow-config-change"
            )
    if resharding:  # checked above without it; the ranks' own check must not see it either
        unchecked = f"++launch.env.{ENV_CONFIG_HASH}="
        config = load_config(
            layout.launch_config, [*overrides, *request.overrides, *resharding, unchecked]
        )
    return ReplayConfig(config, steps, weights)


def dump_dir(original: JobConfig, run_dir: Path) -> Path:
    """Where the run's dumps are: below RUN_DIR as given when they were below the run's own
    directory (a copied or moved run directory replays its own dumps, never the original's),
    else the path the config names."""
    recorded = original.trajectory_dir
    try:
        return run_dir / recorded.relative_to(original.run_dir)
    except ValueError:
        return recorded


def unstored_secrets(original: JobConfig, source: Path) -> list[str]:
    """Overrides that put back the ``launch.env`` secrets the run directory never stores
    (``launch_files``): each from this environment, or a one-line error naming it."""
    overrides = []
    for name, value in original.launch.env.items():
        if value != REDACTED:
            continue
        if name not in os.environ:
            raise UserError(
                f"{source}: launch.env.{name} is a secret and was not stored; export {name} "
                "and run the replay again"
            )
        overrides.append(f"++launch.env.{name}={os.environ[name]}")
    return overrides


def _data_parallel(original: JobConfig, nproc: int | None, recorded_dp: int) -> int:
    """The replay's data-parallel size: ``--nproc``, else an AReaL actor's allocation, else
    the ranks that recorded the dump."""
    actor = original.raw.get("actor")
    spec = actor.get("backend") if isinstance(actor, dict) else None
    allocation = parse_allocation(spec) if isinstance(spec, str) else None
    return nproc or (allocation.dp if allocation is not None else recorded_dp)


def _fed_manifests(
    request: ReplayRequest, steps: list[int], available: dict[int, list[Path]],
    manifests: list[dict],
) -> list[dict]:  # fmt: skip
    """The manifests of the step whose groups a ``--groups`` replay feeds: the replayed step's,
    or ``--groups-of``'s (a step dumped, which trained)."""
    if request.groups_of is None:
        return manifests
    if request.groups_of not in available:
        listing = format_ranks(sorted(available)) or "none"
        raise UserError(
            f"--groups-of {request.groups_of}: not in the dump (complete steps: {listing})"
        )
    return [read_manifest(path) or {} for path in available[request.groups_of]]


def _check_groups(request: ReplayRequest, steps: list[int], recorded: int) -> None:
    """``--groups`` picks rows of one step's batch, each of them in it."""
    groups = request.groups or ()
    if len(steps) != 1:
        raise UserError("--groups picks groups of one step: give --step N, not a range")
    beyond = sorted(g for g in set(groups) if not 0 <= g < recorded)
    if not groups or beyond:
        source = steps[0] if request.groups_of is None else request.groups_of
        raise UserError(
            f"--groups: step {source} holds groups 0-{recorded - 1}, not "
            f"{format_ranks(beyond) or 'none'}"
        )


def _new_trial(
    config: JobConfig, steps: list[int], groups: tuple[int, ...] | None, groups_of: int | None
) -> str:
    """``<trial>_replay<N>[_g<groups>[of<M>]]``, with no '-' (AReaL's rule for trial names:
    ``0,2-3`` reads ``0_2to3``) and no ',' (Hydra reads one as a sweep)."""
    span = f"{steps[0]}" if len(steps) == 1 else f"{steps[0]}to{steps[-1]}"
    if groups is not None:
        span += "_g" + format_ranks(groups).replace(", ", "_").replace("-", "to")
        span += "" if groups_of is None else f"of{groups_of}"
    base = f"{config.trial_name}_replay{span}"
    trial, counter = base, 2
    while (Path(config.fileroot) / config.experiment_name / trial).exists():
        trial, counter = f"{base}_{counter}", counter + 1
    return trial
