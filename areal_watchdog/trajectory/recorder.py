"""Record every training step's rollout batch, and read it back for replay.

Files follow AReaL's proposed ``trajectory_debug`` layout, so dumps from either side are
interchangeable: ``step_{step:06d}.pt`` (one data-parallel rank) or ``step_{step:06d}_dp_{k}.pt``,
each a ``torch.save`` of ``list[dict[str, Tensor | plain value]]`` (one dict per prompt group),
loadable by plain ``torch.load``. Beside each file a manifest
(``step_{step:06d}[_dp_{k}].manifest.json``) lists tensor names, shapes, dtypes and byte sizes,
the file's SHA-256, the world and DP sizes and the config hash.

Writes happen on a background thread (a bounded queue: a full queue makes ``record`` wait, never
grows memory), atomically (temporary file, fsync, manifest, rename). A full disk or an
unwritable directory disables dumping with one warning; training goes on.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import queue
import shutil
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from areal_watchdog.common.atomic import write_json_atomic
from areal_watchdog.rundir.progress.heartbeat import heartbeat
from areal_watchdog.trajectory.format import (
    ENV_CONFIG_HASH,
    ENV_DIR,
    ENV_DUMP_STEPS,
    ENV_MAX_KEEP,
    ENV_PIN_STEPS,
    FORMAT_VERSION,
    int_list,
    list_step_files,
    manifest_path,
    step_file_name,
)

Batch = list[dict[str, Any]]


def describe_batch(batch: Batch) -> list[dict[str, Any]]:
    """Per group and key: shape, dtype and byte size of every tensor (plain values: type)."""
    entries = []
    for index, group in enumerate(batch):
        for name, value in group.items():
            if isinstance(value, torch.Tensor):
                entries.append(
                    {
                        "group": index,
                        "name": name,
                        "shape": list(value.shape),
                        "dtype": str(value.dtype).replace("torch.", ""),
                        "bytes": value.element_size() * value.nelement(),
                    }
                )
            else:
                entries.append({"group": index, "name": name, "type": type(value).__name__})
    return entries


def _snapshot(batch: Batch) -> Batch:
    """A structural copy (new list and dicts) safe to hand to the writer; CPU tensors are shared,
    tensors on another device or needing grad are copied to plain CPU tensors."""
    return [{k: _to_cpu(v) for k, v in group.items()} for group in batch]


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and (value.requires_grad or value.device.type != "cpu"):
        return value.detach().cpu()
    return value


@dataclass
class _Job:
    step: int
    batch: Batch
    completed: int | None  # the step finished before this one (the heartbeat's meaning)


class TrajectoryRecorder:
    """Dump rollout batches off the training thread; see the module docstring.

    ``record`` keeps references to the batch's CPU tensors (GPU tensors are copied to the CPU):
    do not modify them in place until the step is written, or pass ``copy=True``.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        dp_rank: int | None = None,
        dp_size: int = 1,
        world_size: int = 1,
        max_keep: int | None = 5,
        pin_steps: Iterable[int] = (),
        dump_steps: Iterable[int] | None = None,
        max_pending: int = 2,
        config_hash: str = "",
        beats: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self.beats = beats  # off where the job's own step lines say its progress (AReaL)
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.world_size = world_size
        self.max_keep = max_keep
        self.pin_steps = set(pin_steps)
        self.dump_steps = None if dump_steps is None else set(dump_steps)
        self.config_hash = config_hash
        self.disabled_reason: str | None = None
        self.blocked_seconds = 0.0  # time record() waited on a full queue
        self.written: list[int] = []
        self.last_step: int | None = None  # the step recorded last: complete once another comes
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=max(1, max_pending))
        self._thread = threading.Thread(
            target=self._write_loop, name="areal-trajectory-writer", daemon=True
        )
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self.disable(f"cannot create {self.directory}: {exc.strerror}")
        self._thread.start()

    @classmethod
    def from_env(
        cls, dp_rank: int | None = None, dp_size: int = 1, beats: bool = True
    ) -> TrajectoryRecorder | None:
        """The recorder ``areal-launch`` turned on for this job, or None when dumping is off."""
        directory = os.environ.get(ENV_DIR)
        if not directory:
            return None
        keep = os.environ.get(ENV_MAX_KEEP, "5")
        return cls(
            directory,
            dp_rank=dp_rank,
            dp_size=dp_size,
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            max_keep=int(keep) if keep else None,
            pin_steps=int_list(os.environ.get(ENV_PIN_STEPS, "")),
            dump_steps=int_list(os.environ[ENV_DUMP_STEPS])
            if os.environ.get(ENV_DUMP_STEPS)
            else None,
            config_hash=os.environ.get(ENV_CONFIG_HASH, ""),
            beats=beats,
        )

    def record(self, step: int, batch: Batch, copy: bool = False) -> None:
        """Queue ``batch`` as step ``step``; waits only when the queue is full.

        A batch arrives when its step starts, so it tells the watchdog that the step recorded
        before it completed (a heartbeat carries the last completed step, like the step lines).
        """
        completed, self.last_step = self.last_step, step
        if self.disabled_reason or (self.dump_steps is not None and step not in self.dump_steps):
            self._beat(completed)
            return
        snapshot = _snapshot(batch)
        if copy:
            snapshot = [
                {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in g.items()}
                for g in snapshot
            ]
        started = time.perf_counter()
        self._queue.put(_Job(step, snapshot, completed))
        self.blocked_seconds += time.perf_counter() - started

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every queued step is on disk."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)

    def close(self, timeout: float = 60.0) -> None:
        self.flush(timeout)
        self._queue.put(None)
        self._thread.join(timeout)

    def _beat(self, completed: int | None) -> None:
        if self.beats:
            heartbeat(completed)

    def disable(self, reason: str) -> None:
        """Stop dumping, with one warning; training goes on."""
        if self.disabled_reason is None:
            self.disabled_reason = reason
            print(
                f"[areal-watchdog] trajectory dumping disabled, training goes on: {reason}",
                file=sys.stderr,
                flush=True,
            )

    def _write_loop(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                self._beat(job.completed)  # off the training thread: it is a file write
                if not self.disabled_reason:
                    self._write(job)
            finally:
                self._queue.task_done()

    def _write(self, job: _Job) -> None:
        final = self.directory / step_file_name(job.step, self.dp_rank)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        try:
            digest = hashlib.sha256()
            with open(tmp, "wb") as fh:
                torch.save(job.batch, _HashingWriter(fh, digest))
                fh.flush()
                os.fsync(fh.fileno())
            size = tmp.stat().st_size
            manifest = {
                "format_version": FORMAT_VERSION,
                "step": job.step,
                "dp_rank": self.dp_rank,
                "dp_size": self.dp_size,
                "world_size": self.world_size,
                "config_hash": self.config_hash,
                "file": final.name,
                "bytes": size,
                "sha256": digest.hexdigest(),
                "groups": len(job.batch),
                "tensors": describe_batch(job.batch),
                "created": time.time(),
            }
            # The manifest first: a data file under its final name always has one (a data file
            # without a manifest can only be AReaL's own), and a crash in between leaves only
            # an orphan manifest, which nothing lists.
            write_json_atomic(manifest_path(final), manifest, fsync=True)
            os.replace(tmp, final)
            self.written.append(job.step)
            self._rotate()
        except Exception as exc:  # noqa: BLE001 - torch reports a full disk as RuntimeError
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            self.disable(f"writing {final.name} failed: {self._explain(exc, job.batch)}")

    def _explain(self, exc: Exception, batch: Batch) -> str:
        """A readable cause: torch reports a full disk as an obscure stream-position error."""
        needed = sum(t["bytes"] for t in describe_batch(batch) if "bytes" in t)
        try:
            free = shutil.disk_usage(self.directory).free
        except OSError:
            free = None
        if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or (
            free is not None and free < needed
        ):
            return f"No space left on device ({free} bytes free, the step needs {needed})"
        if isinstance(exc, OSError) and exc.strerror:
            return exc.strerror
        return (str(exc).splitlines() or [type(exc).__name__])[0][:200]

    def _rotate(self) -> None:
        if self.max_keep is None:
            return
        mine = [(s, p) for s, dp, p in list_step_files(self.directory) if dp == self.dp_rank]
        steps = sorted({s for s, _ in mine})
        keep = (
            set(steps[-self.max_keep :]) | self.pin_steps if self.max_keep > 0 else self.pin_steps
        )
        for step, path in mine:
            if step not in keep:
                path.unlink(missing_ok=True)
                manifest_path(path).unlink(missing_ok=True)


class _HashingWriter:
    """A file wrapper that hashes what torch.save writes, so the checksum needs no re-read."""

    def __init__(self, fh: Any, digest: Any) -> None:
        self.fh, self.digest = fh, digest

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()
