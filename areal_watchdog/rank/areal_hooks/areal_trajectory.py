"""Dump every training step's rollout batch inside a real AReaL job, and replay it, with no edit
of the script.

AReaL has not merged a dump of its own (issue #1343, PR #1407), so the batch is taken where
PR #1407 takes it: what ``PPOTrainer.train`` receives from ``self.actor.prepare_batch`` each
step. When AReaL's trainer module is imported in a watched process (the single controller, or
every SPMD rank), ``PPOTrainer.train`` is wrapped; for the length of one ``train`` call the
actor's ``prepare_batch`` is shadowed on that one object (no class of AReaL changes):

- single controller: the batch holds ``RTensor`` handles to data on the rollout workers; it is
  fetched once (``RTensor.localize``) and written as ``step_{step:06d}.pt``;
- SPMD: each data-parallel head writes its share, ``step_{step:06d}_dp_{k}.pt``, as PR #1407's
  ``is_data_parallel_head()`` gate does.

``step`` is AReaL's ``global_step`` (0-based, continued after a recover).

A replay (``areal-launch replay``) runs the same script with PR #1407's null rollout:
``PPOTrainer._init_rollout`` returns an object that does nothing, so no rollout worker and no
inference server is ever started; the actor's ``prepare_batch`` returns the dumped batches (this
rank's share in SPMD), and its ``connect_engine`` and ``update_weights`` do nothing. Each batch
handed over is a heartbeat (a replayed step that hangs is judged by ``stall_timeout``), and the
replay never writes a recover checkpoint: the one it loaded may be the original run's
(``trajectory/replay/areal_replay.py``).

The hook checks AReaL's version and the signatures it relies on. A dump switches itself off with
one warning when they differ, and whatever fails, training goes on unchanged; a replay that
cannot be made stops the script with one line instead of running the real rollout.
"""

from __future__ import annotations

import functools
import inspect
import os
import statistics
import sys
import time
from types import ModuleType
from typing import Any

from areal_watchdog.common.areal_version import is_known, unknown_note
from areal_watchdog.rank.areal_hooks.after_import import after_import
from areal_watchdog.rundir.progress.heartbeat import heartbeat
from areal_watchdog.trajectory.format import ENV_DIR, ENV_REPLAY_DIR

TRAINER_MODULE = "areal.trainer.rl_trainer"
PREPARE_BATCH_PARAMS = ("dataloader", "workflow", "workflow_kwargs", "should_accept_fn")
INIT_ROLLOUT_PARAMS = ("rollout_config", "is_eval")
_installed = False


def install() -> None:
    """Wrap AReaL's trainer as soon as it is imported (at once when it already is)."""
    global _installed
    if _installed or not (os.environ.get(ENV_DIR) or os.environ.get(ENV_REPLAY_DIR)):
        return
    _installed = True
    after_import(TRAINER_MODULE, _patch)


def warn(reason: str) -> None:
    """The one line a user sees when dumping is off; training is not affected."""
    print(f"[areal-watchdog] trajectory dumping off, training goes on: {reason}", file=sys.stderr)


def mismatch(trainer: Any, version: str) -> str | None:
    """Why the hook must not touch this AReaL (None: it may). The releases whose trainer loop
    it was checked against are ``areal_version.KNOWN_SERIES`` (1.0 and 2.0 share the loop,
    ``prepare_batch``, ``_init_rollout``, ``RTensor.localize`` and the recover path it uses)."""
    if not is_known(version):
        return unknown_note(version, "its trainer loop is unchecked")
    code = getattr(getattr(trainer, "train", None), "__code__", None)
    if code is None or "prepare_batch" not in code.co_names:
        return "PPOTrainer.train no longer calls prepare_batch"
    init = getattr(trainer, "_init_rollout", None)
    if init is None or tuple(inspect.signature(init).parameters)[1:3] != INIT_ROLLOUT_PARAMS:
        return "PPOTrainer._init_rollout is not AReaL 1.0's or 2.0's"
    return None


def _patch(module: ModuleType) -> None:
    try:
        import areal

        trainer = module.PPOTrainer
        problem = mismatch(trainer, str(getattr(areal, "__version__", "?")))
    except Exception as exc:  # noqa: BLE001 - never break the import of AReaL's trainer
        problem = f"cannot inspect AReaL's trainer ({exc.__class__.__name__})"
    if os.environ.get(ENV_REPLAY_DIR):
        if problem:
            sys.exit(f"[areal-watchdog] cannot replay: {problem}")
        trainer._init_rollout = _replaying_init_rollout(trainer._init_rollout)
    elif problem:
        warn(problem)
    else:
        trainer.train = _wrap_train(trainer.train)


def _wrap_train(train: Any) -> Any:
    @functools.wraps(train)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        dumping = _attach(self)
        try:
            return train(self, *args, **kwargs)
        finally:
            if dumping is not None:
                dumping.detach()

    return wrapped


def _attach(trainer: Any) -> _Dumping | None:
    try:
        return _Dumping(trainer)
    except _Off as off:
        warn(str(off))
    except Exception as exc:  # noqa: BLE001 - training goes on without dumps
        warn(f"{exc.__class__.__name__}: {exc}")
    return None


class _Off(Exception):
    """This trainer cannot be hooked; the message says why."""


def _check_prepare_batch(actor: Any) -> None:
    params = tuple(inspect.signature(type(actor).prepare_batch).parameters)[1:]
    if params[: len(PREPARE_BATCH_PARAMS)] != PREPARE_BATCH_PARAMS:
        raise _Off(f"{type(actor).__name__}.prepare_batch{params} is not AReaL 1.0's or 2.0's")


class _Dumping:
    """One ``train`` call's dumping: the shadowed ``prepare_batch`` and its recorder."""

    def __init__(self, trainer: Any) -> None:
        from areal.infra.controller.train_controller import TrainController

        from areal_watchdog.trajectory.recorder import TrajectoryRecorder

        self.actor = trainer.actor
        _check_prepare_batch(self.actor)
        self.step = first_step(trainer)
        self.controller = isinstance(self.actor, TrainController)
        head = self.controller or self.actor.is_data_parallel_head()
        dp_rank = None if self.controller else self.actor.data_parallel_rank
        dp_size = 1 if self.controller else self.actor.data_parallel_world_size
        self.recorder = (
            TrajectoryRecorder.from_env(dp_rank=dp_rank, dp_size=dp_size, beats=False)
            if head
            else None
        )
        self.waited: list[float] = []  # seconds the training loop spent on each step's dump
        self.bound = self.actor.prepare_batch
        self.actor.prepare_batch = self.dump_after_prepare

    def dump_after_prepare(self, *args: Any, **kwargs: Any) -> Any:
        batch = self.bound(*args, **kwargs)
        step, self.step = self.step, self.step + 1
        if self.recorder is not None:
            started = time.perf_counter()
            try:
                self.recorder.record(step, self._local(batch))
            except Exception as exc:  # noqa: BLE001 - a dump never fails a step
                self.recorder.disable(f"{exc.__class__.__name__}: {exc}")
            self.waited.append(time.perf_counter() - started)
        return batch

    def _local(self, batch: Any) -> Any:
        if not self.controller:
            return batch
        from areal.infra.rpc.rtensor import RTensor

        return RTensor.localize(batch)

    def detach(self) -> None:
        if self.actor.__dict__.get("prepare_batch") == self.dump_after_prepare:
            del self.actor.prepare_batch
        if self.recorder is not None:
            self.recorder.close()
            self._summary()

    def _summary(self) -> None:
        """One line on what the dump cost, for the user and for ``benchmarks/``."""
        if not self.waited or self.recorder.disabled_reason:
            return
        waited = statistics.median(self.waited) * 1000
        print(
            f"[areal-watchdog] trajectory: {len(self.recorder.written)} step(s) dumped to "
            f"{self.recorder.directory}; the training loop waited {waited:.1f} ms per step "
            "(median)",
            file=sys.stderr,
        )


def first_step(trainer: Any) -> int:
    """The global step ``train`` starts at: 0, or the one after AReaL's recover checkpoint."""
    info = trainer.recover_info
    return info.last_step_info.next().global_step if info is not None else 0


def _replaying_init_rollout(init_rollout: Any) -> Any:
    @functools.wraps(init_rollout)
    def wrapped(self: Any, rollout_config: Any, is_eval: bool = False, **kwargs: Any) -> Any:
        if is_eval:
            return None  # no evaluation in a replay: AReaL skips it without an eval rollout
        try:
            _check_prepare_batch(self.actor)
            _Replaying(self)
        except (_Off, ValueError, OSError) as exc:
            sys.exit(f"[areal-watchdog] cannot replay: {exc}")
        return NoRollout()

    return wrapped


class NoRollout:
    """PR #1407's null rollout: every call does nothing (statistics: none)."""

    callback_addr = ""
    server_infos: list[Any] = []
    staleness_manager = None  # what AReaL's recover path looks up after loading a checkpoint

    @property
    def workflow_executor(self) -> NoRollout:  # SPMD's route to the staleness manager
        return self

    def export_stats(self) -> dict[str, Any]:
        return {}

    def __getattr__(self, name: str) -> Any:
        return _nothing


def _nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


class _Replaying:
    """The actor of a replay: batches from the dump, no link to any inference server, and no
    recover checkpoint written (the one loaded may belong to the original run)."""

    def __init__(self, trainer: Any) -> None:
        from areal.infra.controller.train_controller import TrainController

        from areal_watchdog.trajectory.reader import Replay

        actor = trainer.actor
        self.trainer = trainer
        self.controller = isinstance(actor, TrainController)
        dp_rank = 0 if self.controller else actor.data_parallel_rank
        dp_size = 1 if self.controller else actor.data_parallel_world_size
        replay = Replay.from_env(dp_rank=dp_rank, dp_size=dp_size)
        if replay is None:
            raise ValueError(f"{ENV_REPLAY_DIR} is not set")
        self.batches = replay.batches()
        self.delivered: int | None = None  # set at the first batch, once the trainer is built
        actor.prepare_batch = self.next_batch
        actor.connect_engine = _nothing
        actor.update_weights = _nothing

    def next_batch(self, *_args: Any, **_kwargs: Any) -> Any:
        step = next(self.batches, None)
        if step is None:
            raise RuntimeError("every dumped step was replayed: set total_train_steps")
        batch = step[1]
        if self.delivered is None:
            self.delivered = first_step(self.trainer)
            self.trainer.recover_handler.dump = _nothing
        # Progress as the replay's step lines count it: a replayed step that hangs is then
        # judged by stall_timeout, as in the original run, not by startup_timeout.
        heartbeat(self.delivered)
        self.delivered += 1
        if self.controller:
            return batch
        from areal.infra.platforms import current_platform
        from areal.utils.data import tensor_container_to

        return tensor_container_to(batch, current_platform.current_device())
