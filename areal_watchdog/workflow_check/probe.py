"""Runs in ``launch.python``: the job's own training script, as training runs it, up to
``PPOTrainer.train``; its workflow and reward then run against the server in three stages and
the result is written where the launcher asked. Nothing of AReaL is edited: ``PPOTrainer``'s
constructor only keeps the config and dataset (no scheduler, no engines, no process group), and
``train`` runs the check instead of the training.

    python -m areal_watchdog.workflow_check.probe REQUEST.json
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import runpy
import sys
import threading
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import write_json_atomic
from areal_watchdog.config.areal_side.areal import parse_allocation
from areal_watchdog.rank.areal_hooks.areal_trajectory import TRAINER_MODULE
from areal_watchdog.workflow_check.model import CheckResult, StageResult
from areal_watchdog.workflow_check.stages import (
    Episodes,
    one_line,
    run_on_own_loop,
    summarise,
    wait_thread,
)
from areal_watchdog.workflow_check.staleness import Staleness

MARK = "[check-workflow]"
TRAPPED_LIMIT = 20.0  # seconds: a gate that stays shut shows itself at once


def say(line: str) -> None:
    """A progress line: the launcher shows these and keeps AReaL's own log aside."""
    print(f"{MARK} {line}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> None:
    """Run the script with ``PPOTrainer`` intercepted; every way out writes a result."""
    request = json.loads(Path(argv[0]).read_text())
    out, entry = Path(request["result"]), request["entry"]
    say("loading the training script up to PPOTrainer.train (AReaL's imports take 10-20 s)")
    _intercept(importlib.import_module(TRAINER_MODULE).PPOTrainer, request, out)
    try:
        _run_script(entry, request["args"])
    except BaseException as exc:  # the script's own failure, before train: the user's to see
        _finish(out, CheckResult(error=f"{entry} failed before PPOTrainer.train: {one_line(exc)}"))
    _finish(out, CheckResult(error=f"{entry} returned without calling PPOTrainer.train: no "
                                   "workflow to check"))  # fmt: skip


def _finish(out: Path, result: CheckResult) -> None:
    """Write the result and leave at once: AReaL's executor threads and a stuck episode's
    tools would otherwise hold the process (the launcher ends its process group)."""
    write_json_atomic(out, result.to_dict())
    sys.stderr.flush()
    os._exit(0)


def _run_script(entry: str, args: list[str]) -> None:
    if entry.endswith(".py"):
        sys.argv = [entry, *args]
        sys.path.insert(0, os.path.dirname(entry))
        runpy.run_path(entry, run_name="__main__")
    else:
        sys.argv = [entry, *args]
        runpy.run_module(entry, run_name="__main__", alter_sys=True)


def _intercept(trainer: type, request: dict[str, Any], out: Path) -> None:
    def init(self: Any, config: Any, train_dataset: Any = None, *_a: Any, **_k: Any) -> None:
        self.config, self.check_dataset = config, train_dataset

    def train(self: Any, workflow: Any = None, _eval: Any = None, workflow_kwargs: Any = None,
              *_a: Any, **_k: Any) -> None:  # fmt: skip
        try:
            result = check(self.config, self.check_dataset, workflow, workflow_kwargs, request)
        except Exception as exc:  # a bug of the check's, not the script's: say which
            result = CheckResult(error=f"the check failed in PPOTrainer.train: {one_line(exc)}")
        _finish(out, result)

    trainer.__init__ = init  # type: ignore[misc]
    trainer.train = train  # type: ignore[attr-defined]
    trainer.__enter__ = lambda self: self  # type: ignore[attr-defined]
    trainer.__exit__ = lambda self, *exc: None  # type: ignore[attr-defined]
    trainer.close = lambda self: None  # type: ignore[attr-defined]


def name_of(thing: Any) -> str:
    """An import string as given, else the object's module and qualified name."""
    if thing is None or isinstance(thing, str):
        return thing or ""
    kind = thing if isinstance(thing, type) or callable(thing) else type(thing)
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', repr(kind))}"


def rewards_called() -> list[str]:
    """The reward functions AReaL's ``AsyncRewardWrapper`` runs from now on, by name, in the
    order first called: what the workflow scores with, whatever ``workflow_kwargs`` named (a
    workflow may wrap another function). The list fills as the stages run."""
    called: list[str] = []
    try:
        from areal.api.reward_api import AsyncRewardWrapper
    except ImportError:
        return called
    original = AsyncRewardWrapper.__call__

    async def recorded(wrapper: Any, *args: Any, **kwargs: Any) -> Any:
        name = name_of(getattr(wrapper, "reward_fn", None))
        if name and name not in called:
            called.append(name)
        return await original(wrapper, *args, **kwargs)

    AsyncRewardWrapper.__call__ = recorded  # type: ignore[method-assign]
    return called


def staleness_of(config: Any, batch_size: int) -> Staleness:
    """The gate's numbers from AReaL's own config objects (their defaults applied)."""
    rollout = config.rollout
    allocation = parse_allocation(str(getattr(rollout, "backend", "") or ""))
    return Staleness(
        batch_size, int(config.gconfig.n_samples), allocation.dp if allocation else 1,
        int(rollout.consumer_batch_size), int(rollout.max_head_offpolicyness),
        rollout.max_concurrent_rollouts,
    )  # fmt: skip


def check(
    config: Any, dataset: Any, workflow: Any, kwargs: Any, request: dict[str, Any]
) -> CheckResult:
    """The three stages; the first that does not pass ends the check (the guide's order)."""
    named = {"workflow": name_of(workflow), "reward": name_of((kwargs or {}).get("reward_fn"))}
    called = rewards_called()
    if workflow is None:
        return CheckResult(error="PPOTrainer.train got no workflow (AReaL's online agent mode "
                           "has none to run here): nothing to check")  # fmt: skip
    if dataset is None or len(dataset) == 0:
        return CheckResult(**named, error="the script gave PPOTrainer no train_dataset rows")
    gate = staleness_of(config, int(config.train_dataset.batch_size))
    try:
        engine = _engine(config, request, gate.dp)
        # RemotevLLMEngine and RemoteSGLangEngine hold AReaL's RemoteInfEngine, which resolves
        # a workflow as training does (an import string, a class and its kwargs, an instance)
        bare = getattr(engine, "_engine", engine)._resolve_workflow(workflow, kwargs, 1)
    except Exception as exc:
        return CheckResult(**named, error=f"the workflow could not be made: {one_line(exc)}")
    rows = [dataset[i] for i in range(min(len(dataset), gate.batch_size))]
    done: list[StageResult] = []
    dump = Path(request["dump"])
    for stage in (_one_episode, _one_batch, functools.partial(_through_engine, dump=dump)):
        done.append(stage(engine, bare, rows, gate, float(request["limit"])))
        if not done[-1].passed:
            break
    return CheckResult(**named, engine=type(engine).__name__, staleness=gate.to_dict(),
                       stages=done, reward_called=called)  # fmt: skip


def _engine(config: Any, request: dict[str, Any], dp: int) -> Any:
    if request["engine"] == "sglang":
        from areal.engine.sglang_remote import RemoteSGLangEngine as Engine
    else:
        from areal.engine.vllm_remote import RemotevLLMEngine as Engine
    engine = Engine(config.rollout)
    engine.initialize(addr=[request["server"]], train_data_parallel_size=dp)
    return engine


def _one_episode(
    engine: Any, bare: Any, rows: list[Any], _gate: Staleness, limit: float
) -> StageResult:
    say(f"stage 1: one episode (row 0), at most {limit:g} s")
    jobs = [("row 0", lambda: bare.arun_episode(engine, dict(rows[0])))]
    episodes, wall, thread = run_on_own_loop(jobs, 1, limit)
    return summarise("one episode", "row 0 of train_dataset", 1, episodes, wall, limit, thread)


def _one_batch(
    engine: Any, bare: Any, rows: list[Any], gate: Staleness, limit: float
) -> StageResult:
    at_once = min(len(rows), gate.dp * gate.at_once) * gate.n_samples
    detail = (f"{len(rows)} rows x {gate.n_samples} samples, {at_once} at once "
              f"({gate.dp} rollout worker{'s' if gate.dp > 1 else ''} x {gate.at_once} "
              f"group{'s' if gate.at_once > 1 else ''})")  # fmt: skip
    say(f"stage 2: one batch, {detail}, at most {limit:g} s")
    jobs = [
        (f"row {r} sample {s}", lambda r=r: bare.arun_episode(engine, dict(rows[r])))
        for r in range(len(rows))
        for s in range(gate.n_samples)
    ]
    episodes, wall, thread = run_on_own_loop(jobs, at_once, limit)
    return summarise("one batch", detail, len(jobs), episodes, wall, limit, thread)


def _through_engine(
    engine: Any, bare: Any, rows: list[Any], gate: Staleness, limit: float, dump: Path
) -> StageResult:
    """One rollout worker's share of the batch through ``rollout_batch``, staleness gate on;
    the trajectories it returns are kept as a dumped step 0 (``check-consistency`` reads it)."""
    from areal.api import RolloutWorkflow

    share = [dict(r) for r in rows[: gate.share]]
    episodes, labels = Episodes(), {id(row): f"row {i}" for i, row in enumerate(share)}
    samples: dict[str, int] = {}

    class Timed(RolloutWorkflow):  # type: ignore[misc, valid-type]
        async def arun_episode(self, eng: Any, data: Any) -> Any:
            label = labels.get(id(data), "row ?")
            samples[label] = samples.get(label, -1) + 1
            episode = episodes.add(f"{label} sample {samples[label]}")
            return await episodes.timed(episode, bare.arun_episode(eng, data))

    limit = min(limit, TRAPPED_LIMIT) if gate.trapped else limit
    detail = f"{len(share)} rows x {gate.n_samples} samples through {type(engine).__name__}"
    say(f"stage 3: AReaL's rollout engine, {detail}, at most {limit:g} s")
    batch = _Batch(engine, share, Timed(), gate.n_samples)
    wall, _ = wait_thread(batch, limit)
    if batch.result is not None:
        import torch

        dump.parent.mkdir(parents=True, exist_ok=True)
        torch.save(batch.result, dump)
    planned = len(share) * gate.n_samples
    return summarise("AReaL engine", detail, planned, episodes, wall, limit, errors=batch.errors)


class _Batch(threading.Thread):
    """``rollout_batch`` in a daemon thread: it has no time limit of its own."""

    def __init__(self, engine: Any, rows: list[Any], workflow: Any, group_size: int) -> None:
        super().__init__(daemon=True)
        self.engine, self.rows, self.workflow, self.group_size = engine, rows, workflow, group_size
        self.errors: list[str] = []
        self.result: list[dict[str, Any]] | None = None

    def run(self) -> None:
        try:
            self.result = self.engine.rollout_batch(
                self.rows, workflow=self.workflow, group_size=self.group_size
            )
        except Exception as exc:
            self.errors.append(f"rollout_batch: {one_line(exc)}")


if __name__ == "__main__":
    main(sys.argv[1:])
