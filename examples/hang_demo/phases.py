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
              endpoint: ``tests/slow_endpoint.py``) while the others wait in all_reduce
"""

from __future__ import annotations

import http.client
import os
import tempfile
import time
import urllib.parse
from pathlib import Path

import torch

CHUNK = 1 << 20


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


def evaluate(seconds: float) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    end = time.time() + seconds
    while time.time() < end:
        logits = forward_pass(model)
        score_answers(logits)


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
