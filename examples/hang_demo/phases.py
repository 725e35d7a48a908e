"""Slow-but-healthy phases that every real job has, with no log line while they last, for the
hang demo's ``demo.phases`` (``checkpoint@3,cpu_eval@6``: a phase and the step it runs before):

  checkpoint  ``demo.phase_rank`` (rank 0 by default) writes ``demo.phase_mb`` MB in fsync'd 1 MB
              chunks, spread over ``demo.phase_time`` seconds, while the others wait in the
              step's all_reduce (the usual shape of a rank-0 save)
  cpu_eval    every rank (or those of ``demo.eval_ranks``: a slow node) evaluates on the CPU
              for ``demo.phase_time`` seconds: forward passes and a Python scoring loop by
              turns (stacks that vary), no collective; the other ranks wait in all_reduce
  read        every rank reads its own ``demo.phase_mb`` MB file in 1 MB chunks, spread over
              ``demo.phase_time`` seconds (a dataset shard read at the start of an epoch)
  upload      ``demo.phase_rank`` posts ``demo.phase_mb`` MB to ``demo.phase_url`` (a slow
              endpoint: ``testkit/slow_endpoint.py``) while the others wait in all_reduce
  child_checkpoint  ``demo.phase_rank`` hands its checkpoint to a child process (as ``aws s3
              cp``, ``gsutil``, ``rsync`` or an uploader would) and waits for it: the child
              writes ``demo.phase_mb`` MB in fsync'd 1 MB chunks over ``demo.phase_time``
              seconds, while the others wait in all_reduce
  loader_work every rank (or those of ``demo.eval_ranks``) waits for a batch while its
              DataLoader worker spends ``demo.phase_time`` seconds of CPU on one long document
  async_checkpoint  ``demo.phase_rank`` saves in a background thread (as
              ``torch.distributed.checkpoint.async_save`` does) and waits for the save before
              the step's all_reduce: the main thread sits in ``join``, the data moves in the
              thread (``demo.phase_mb`` MB fsync'd over ``demo.phase_time`` seconds)
  chatty_eval every rank evaluates as ``cpu_eval`` does and logs a progress line per batch to
              stderr: a log flood that is work
  compile     every rank compiles its model with ``torch.compile`` (inductor, C++ on the CPU)
              and runs its first forward pass: a long first-step compile

Where ``demo.shard_dir`` names a directory, every rank reads its next 1 MB of
``<shard_dir>/shard-<rank>.bin`` at every step (a dataset on shared storage: the storage stall
of ``testkit/fuse_storage.py`` is a FUSE filesystem there that stops answering).
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

CHUNK = 1 << 20
COMPILED_LAYERS = 160  # 19 s of compiling for one rank alone here (2 cores); 4 ranks share them


def parse(spec: str) -> dict[int, str]:
    """``checkpoint@3,cpu_eval@6`` -> ``{3: "checkpoint", 6: "cpu_eval"}``."""
    found = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, step = part.partition("@")
        found[int(step)] = name
    return found


def prepare(settings: dict, rank: int) -> Path | None:
    """The file a ``read`` phase reads, written before the first step (None: no such phase)."""
    if "read" not in parse(str(settings.get("phases") or "")).values():
        return None
    path = Path(tempfile.gettempdir()) / f"hang-demo-shard-{os.getpid()}-{rank}.bin"
    with path.open("wb") as fh:
        for _ in range(int(settings["phase_mb"])):
            fh.write(os.urandom(CHUNK))
    return path


def run(name: str, settings: dict, rank: int, shard: Path | None) -> None:
    """Run phase ``name`` on this rank, if it is one of the ranks the phase runs on."""
    seconds, megabytes = float(settings["phase_time"]), int(settings["phase_mb"])
    if name == "checkpoint" and rank == int(settings["phase_rank"]):
        save_checkpoint(megabytes, seconds)
    elif name == "cpu_eval" and chosen(settings["eval_ranks"], rank):
        evaluate(seconds)
    elif name == "read" and shard is not None:
        read_shard(shard, seconds)
    elif name == "upload" and rank == int(settings["phase_rank"]):
        upload(str(settings["phase_url"]), megabytes)
    elif name == "child_checkpoint" and rank == int(settings["phase_rank"]):
        subprocess.run([sys.executable, "-c", CHILD_WRITER, str(megabytes), str(seconds)],
                       check=True)  # fmt: skip
    elif name == "loader_work" and chosen(settings["eval_ranks"], rank):
        next(iter(DataLoader(LongDocument(seconds), batch_size=1, num_workers=1)))
    elif name == "async_checkpoint" and rank == int(settings["phase_rank"]):
        saver = threading.Thread(target=save_checkpoint, args=(megabytes, seconds), name="saver")
        saver.start()
        saver.join()  # the save's future, waited for before the next one
    elif name == "chatty_eval" and chosen(settings["eval_ranks"], rank):
        evaluate(seconds, chatty=True)
    elif name == "compile":
        compile_first_step()


CHILD_WRITER = """
import os, sys, tempfile, time
megabytes, seconds = int(sys.argv[1]), float(sys.argv[2])
with tempfile.TemporaryFile() as fh:
    for _ in range(megabytes):
        fh.write(os.urandom(1 << 20)); fh.flush(); os.fsync(fh.fileno())
        time.sleep(seconds / max(1, megabytes))
"""


class LongDocument(Dataset):
    """One item that takes ``seconds`` of CPU to prepare (tokenising a very long document)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> torch.Tensor:
        end, total = time.time() + self.seconds, 0
        while time.time() < end:
            total += sum(ord(c) for c in "a long document " * 64)
        return torch.tensor([float(total % 7)])


def read_next(shard_dir: str, rank: int, step: int) -> None:
    """This step's 1 MB of the rank's shard on shared storage (``demo.shard_dir``)."""
    with open(os.path.join(shard_dir, f"shard-{rank}.bin"), "rb") as fh:
        fh.seek((step - 1) * CHUNK)
        fh.read(CHUNK)


def chosen(ranks: int | list[int], rank: int) -> bool:
    """Whether ``rank`` is one of ``ranks``: a rank, a list of ranks, or -1 for every rank."""
    listed = ranks if isinstance(ranks, list) else [ranks]
    return -1 in listed or rank in listed


def save_checkpoint(megabytes: int, seconds: float) -> None:
    pause = seconds / max(1, megabytes)
    with tempfile.TemporaryFile() as fh:
        for _ in range(megabytes):
            fh.write(os.urandom(CHUNK))
            fh.flush()
            os.fsync(fh.fileno())
            time.sleep(pause)


def evaluate(seconds: float, chatty: bool = False) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    end, batch = time.time() + seconds, 0
    while time.time() < end:
        logits = forward_pass(model)
        score = score_answers(logits)
        batch += 1
        if chatty:
            print(f"eval batch {batch}: score {score:.3f}", file=sys.stderr, flush=True)


def compile_first_step() -> None:
    """A model of a hundred layers compiled by inductor (a C++ build on the CPU, its caches off
    so that every run compiles) and its first forward pass: minutes on a big model, tens of
    seconds here."""
    import torch._inductor.config as inductor

    inductor.force_disable_caches = True
    layers = [m for _ in range(COMPILED_LAYERS) for m in (torch.nn.Linear(64, 64), torch.nn.GELU())]
    compiled = torch.compile(torch.nn.Sequential(*layers))
    with torch.no_grad():
        compiled(torch.randn(8, 64))


def forward_pass(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.randn(512, 256))


def score_answers(logits: torch.Tensor) -> float:
    total = 0.0
    for row in logits.tolist():  # a reward function's Python loop
        total += max(row) - min(row)
    return total


def read_shard(shard: Path, seconds: float) -> None:
    chunks = max(1, shard.stat().st_size // CHUNK)
    pause = seconds / chunks
    with shard.open("rb") as fh:
        while fh.read(CHUNK):
            time.sleep(pause)
    shard.unlink()


def upload(url: str, megabytes: int) -> None:
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    connection.request("POST", parts.path, body=os.urandom(megabytes * CHUNK))
    connection.getresponse().read()
    connection.close()
