"""Read dumped steps back for replay: verified loads, the global batch, this rank's share.

The reader runs inside the replaying ranks (``Replay.from_env``) and in tests; the files it
reads are the recorder's (``recorder``), checked against their manifests (``format``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from areal_watchdog.common.rankset import format_ranks
from areal_watchdog.rundir.progress.heartbeat import heartbeat
from areal_watchdog.trajectory.format import (
    ENV_CONFIG_HASH,
    ENV_REPLAY_DIR,
    ENV_REPLAY_GROUPS,
    ENV_REPLAY_GROUPS_OF,
    ENV_REPLAY_PAD_STEP,
    ENV_REPLAY_PAD_TO,
    ENV_REPLAY_STEPS,
    ENV_REPLAY_UNSAFE,
    ENV_REPLAY_VERIFIED,
    DumpError,
    check_file,
    complete_steps,
    int_list,
    list_step_files,
    read_manifest,
)
from areal_watchdog.trajectory.recorder import Batch


def load_step_file(
    path: Path,
    *,
    checksum: bool = True,
    unsafe: bool = False,
    manifest: dict[str, Any] | None = None,
) -> Batch:
    """Load one dump file; with a manifest beside it, its size (and ``checksum``) must match.

    Files without a manifest (AReaL's own dumps) load as they are. DumpError names the file.
    """
    if not path.exists():
        raise DumpError(f"{path}: missing")
    manifest = manifest or read_manifest(path)
    if manifest is not None:
        problem = check_file(path, checksum=checksum, manifest=manifest)
        if problem:
            raise DumpError(problem)
    try:
        data = torch.load(path, map_location="cpu", weights_only=not unsafe)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad archive
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        hint = (
            (
                "; it holds objects the safe loader refuses: load it with --unsafe-load only if "
                "you trust its origin"
            )
            if "weights_only" in str(exc)
            else ""
        )
        raise DumpError(
            f"{path}: cannot be loaded ({type(exc).__name__}: {text[:200]}){hint}"
        ) from None
    if not isinstance(data, list) or not all(isinstance(g, dict) for g in data):
        raise DumpError(f"{path}: not a list of dicts (a trajectory dump holds one dict per group)")
    return data


def loadable_problem(path: Path, unsafe: bool) -> str | None:
    """Why the ranks would fail to load this dump (the safe loader refuses what it holds, it
    is no batch), checked by the launcher before any process starts; None when it loads."""
    try:
        load_step_file(path, checksum=False, unsafe=unsafe)
    except DumpError as exc:
        return str(exc)
    return None


def load_global_batch(
    directory: Path,
    step: int,
    *,
    config_hash: str | None = None,
    unsafe: bool = False,
    checksum: bool = True,
) -> Batch:
    """All groups of a step in a fixed order: data-parallel rank 0's groups first, then 1, ..."""
    files = sorted(
        ((dp, p) for s, dp, p in list_step_files(directory) if s == step),
        key=lambda item: -1 if item[0] is None else item[0],
    )
    if not files:
        available = sorted(complete_steps(directory))
        raise DumpError(
            f"{directory}: no dump of step {step} (available steps: "
            f"{format_ranks(available) or 'none'})"
        )
    manifests = {path: read_manifest(path) for _dp, path in files}
    expected = max((int(m.get("dp_size") or 1) for m in manifests.values() if m), default=None)
    if expected and any(dp is not None for dp, _ in files) and len(files) != expected:
        raise DumpError(
            f"{directory}: step {step} has {len(files)} of {expected} data-parallel "
            "files; the missing ones were never written or were deleted"
        )
    groups: Batch = []
    for _dp, path in files:
        recorded = (manifests[path] or {}).get("config_hash")
        if config_hash and recorded and recorded != config_hash:
            raise DumpError(
                f"{path}: recorded with another config (hash {recorded}, this run "
                f"{config_hash}); replay with the run's own config or pass --allow-config-change"
            )
        groups += load_step_file(path, unsafe=unsafe, checksum=checksum, manifest=manifests[path])
    return groups


def split_for_rank(groups: Batch, dp_rank: int, dp_size: int) -> Batch:
    """Rank ``dp_rank``'s share of a step's groups: contiguous chunks, the first
    ``len(groups) % dp_size`` ranks one group larger (deterministic re-sharding)."""
    base, extra = divmod(len(groups), dp_size)
    start = dp_rank * base + min(dp_rank, extra)
    return groups[start : start + base + (1 if dp_rank < extra else 0)]


def select_groups(groups: Batch, wanted: list[int], step: int) -> Batch:
    """The groups a bisection replays, in the batch's order; DumpError past the batch's end."""
    beyond = [g for g in wanted if not 0 <= g < len(groups)]
    if beyond:
        raise DumpError(
            f"step {step} has {len(groups)} groups (0-{len(groups) - 1}): no group "
            f"{format_ranks(beyond)}"
        )
    return [groups[g] for g in sorted(set(wanted))]


class Replay:
    """The steps to replay for this rank, from the environment ``areal-launch replay`` sets."""

    def __init__(
        self,
        directory: Path,
        steps: list[int],
        dp_rank: int,
        dp_size: int,
        unsafe: bool = False,
        config_hash: str | None = None,
        checksum: bool = True,
        groups: list[int] | None = None,
        pad_step: int | None = None,
        pad_to: int = 1,
        groups_of: int | None = None,
    ) -> None:
        self.directory, self.steps = directory, steps
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.unsafe, self.config_hash, self.checksum = unsafe, config_hash, checksum
        self.groups = groups  # a bisection's subset of every step's global batch
        self.pad_step = pad_step  # whose groups (they trained) feed every data-parallel rank
        self.pad_to = pad_to  # AReaL splits a batch evenly: a multiple of the DP size
        self.groups_of = groups_of  # the groups come from this step's batch (one that trained)

    @classmethod
    def from_env(cls, dp_rank: int, dp_size: int) -> Replay | None:
        directory = os.environ.get(ENV_REPLAY_DIR)
        if not directory:
            return None
        return cls(
            Path(directory),
            int_list(os.environ.get(ENV_REPLAY_STEPS, "")),
            dp_rank,
            dp_size,
            unsafe=os.environ.get(ENV_REPLAY_UNSAFE) == "1",
            config_hash=os.environ.get(ENV_CONFIG_HASH) or None,
            checksum=os.environ.get(ENV_REPLAY_VERIFIED) != "1",
            groups=int_list(os.environ[ENV_REPLAY_GROUPS])
            if os.environ.get(ENV_REPLAY_GROUPS)
            else None,
            pad_step=int(os.environ[ENV_REPLAY_PAD_STEP])
            if os.environ.get(ENV_REPLAY_PAD_STEP)
            else None,
            pad_to=int(os.environ.get(ENV_REPLAY_PAD_TO) or 1),
            groups_of=int(os.environ[ENV_REPLAY_GROUPS_OF])
            if os.environ.get(ENV_REPLAY_GROUPS_OF)
            else None,
        )

    def batches(self) -> Iterator[tuple[int, Batch]]:
        """(step, this rank's groups) for every replayed step, in order. Fetching a step tells
        the watchdog that the one before it completed, the first one too (the replay starts
        from the weights after it): a replayed step that hangs is judged by the stall
        threshold, as in the original run, not by the start-up one."""
        for step in self.steps:
            fed = step if self.groups_of is None else self.groups_of
            groups = load_global_batch(
                self.directory,
                fed,
                config_hash=self.config_hash,
                unsafe=self.unsafe,
                checksum=self.checksum,
            )
            if self.groups is not None:
                groups = self._padded(select_groups(groups, self.groups, fed))
            heartbeat(step - 1 if step > 0 else None)
            yield step, split_for_rank(groups, self.dp_rank, self.dp_size)

    def _padded(self, chosen: Batch) -> Batch:
        """A bisection's few groups, padded to a multiple of the DP size with groups of a step
        that trained (they change nothing of whether the replay hangs; AReaL splits a batch
        evenly across its data-parallel ranks)."""
        missing = -len(chosen) % self.pad_to
        if self.pad_step is None or not missing:
            return chosen
        trained = load_global_batch(
            self.directory, self.pad_step, config_hash=self.config_hash, unsafe=self.unsafe
        )
        return chosen + [trained[i % len(trained)] for i in range(missing)]
