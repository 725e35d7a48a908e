"""A small but real distributed training script (torch, gloo, CPU) that can hang on purpose.

It trains a tiny model with DistributedDataParallel, prints AReaL's step line on rank 0, and,
when ``demo.hang`` names a pattern, misbehaves on ``demo.hang_rank`` (a rank or a list of ranks)
at ``demo.hang_step``:

  collective_mismatch  the rank calls broadcast (in a helper) while the others all_reduce
  collective_stuck     the rank freezes itself (SIGSTOP) inside the same all_reduce as the others
  cleanup_deadlock     the rank stops early ("converged") and its cleanup waits in a barrier
  straggler            the rank spins in a busy loop while the others wait
  dataloader_stall     the rank's DataLoader worker never delivers the batch
  init_deadlock        the rank never reaches init_process_group (hang_step is ignored)
  p2p_mismatch         the rank waits in recv for a send that never comes
  crash                the rank raises an exception
  quiet_exit           the rank exits with code 0 while the others go on
  livelock             the rank retries a batch through normalize, tokenize and validate for
                       ever (its stack moves, nothing comes of it) while the others wait
  retry_flood          the rank retries a refused connection with no back-off, logging a
                       warning per try to stderr (a log flood, no work), while the others wait
  child_blocked        the rank runs a helper command that asks a question nobody answers
                       (its stdin a pipe nobody writes to) and waits for it forever
  own_deadlock         the rank deadlocks with its own metrics thread (each waits for a lock
                       the other holds): no collective, no CPU, nothing behind it (give every
                       rank in ``hang_rank`` for every rank stuck in its own code)
  node_lost            the rank freezes its whole node (every process of this Slurm job on it,
                       the watchdog's sidecar too) at once, as a power cut or a kernel hang
                       does: nothing there answers again, and no connection is closed

With ``demo.checkpoint`` (a file), rank 0 records each finished step there and a resumed run
(``on_hang: resume`` sets AREAL_WATCHDOG_RESUME_ATTEMPT) starts after it; ``demo.hang_once``
makes the hang transient: it happens only while ``<checkpoint>.hung`` does not exist.
``demo.phases`` runs slow-but-healthy phases with no log line (a rank-0 checkpoint, a CPU
evaluation, a shard read: ``phases.py``). ``demo.teardown_time`` keeps rank 0 busy after the
last step (a final save) while the others wait in the closing barrier. ``demo.record`` records
every step's batch (``areal_watchdog.trajectory``): ``areal-launch replay`` then feeds the
recorded steps back (the replay that decides a resume), and writes no checkpoint.

Run it through ``areal-launch --watchdog local examples/hang_demo/config.yaml``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import phases
import psutil
import torch
import torch.distributed as dist
import yaml
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

import areal_watchdog
from areal_watchdog.trajectory import Replay, TrajectoryRecorder

GREEN, RESET = "\x1b[32m", "\x1b[0m"


class RandomRegression(Dataset):
    """Random inputs; one index can be made to block forever (the dataloader_stall pattern)."""

    def __init__(self, size: int, block_index: int | None) -> None:
        self.size = size
        self.block_index = block_index

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index == self.block_index:
            time.sleep(10**6)  # a network filesystem that never answers
        gen = torch.Generator().manual_seed(index)
        x = torch.randn(16, generator=gen)
        return x, x.sum().reshape(1)


class Trainer:
    """The training loop; a context manager whose cleanup synchronises with the peers."""

    def __init__(self, settings: dict) -> None:
        self.settings = settings
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        torch.manual_seed(0)
        self.model = DistributedDataParallel(torch.nn.Linear(16, 1))
        self.optim = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        if exc_type is None:  # a failing rank does not wait for its peers
            self.close()

    def close(self) -> None:
        dist.barrier()  # "everyone done?": waits forever if a peer is still in the loop
        dist.destroy_process_group()

    def sync_metrics(self, loss: torch.Tensor) -> float:
        value = loss.detach().clone()
        dist.all_reduce(value)
        return value.item() / self.world

    def announce_metrics(self, loss: torch.Tensor) -> float:
        value = loss.detach().clone()
        dist.broadcast(value, src=0)
        return value.item()

    def step(self, x: torch.Tensor, y: torch.Tensor, misbehave: str | None) -> float:
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.optim.zero_grad()
        loss.backward()
        self.optim.step()
        if misbehave == "collective_mismatch":
            return self.announce_metrics(loss)
        if misbehave == "p2p_mismatch":
            buffer = torch.zeros(1)
            dist.recv(buffer, src=(self.rank + 1) % self.world)
        if misbehave == "straggler":
            busy_reward_model()
        if misbehave == "child_blocked":
            ask_nobody()
        if misbehave == "own_deadlock":
            deadlock_with_own_thread()
        if misbehave == "retry_flood":
            retry_for_ever()
        if misbehave == "livelock":
            retry_the_batch()
        if misbehave == "collective_stuck":
            freeze_soon(0.5)
        if misbehave == "node_lost":
            freeze_node()
        elif self.settings["hang"] == "collective_stuck" and self.is_hang_step:
            time.sleep(2.0)  # let the frozen peer enter the collective first
        if misbehave == "crash":
            raise ValueError("reward shape mismatch: expected [8], got [7]")
        if misbehave == "quiet_exit":
            sys.exit(0)
        return self.sync_metrics(loss)

    is_hang_step = False


def busy_reward_model() -> None:
    total = 0
    while True:  # a reward computation that never finishes
        total += 1


def retry_the_batch() -> None:
    """A retry loop that never succeeds, through several functions: every sample of it lands
    in another one, and nothing leaves the rank."""
    text = "a prompt whose answer never validates " * 200
    while True:
        tokens = tokenize(normalize(text))
        validate(tokens)


def normalize(text: str) -> str:
    return " ".join(text.lower().split())


def tokenize(text: str) -> list[int]:
    return [sum(map(ord, word)) % 50257 for word in text.split()]


def validate(tokens: list[int]) -> bool:
    return sum(tokens) < 0  # never


def retry_for_ever() -> None:
    """Fetch a reward from a service that refuses connections, retrying at once and logging
    every failure (about 0.2 MB/s to stderr)."""
    log = logging.getLogger("reward-client")
    tries = 0
    while True:
        tries += 1
        try:
            socket.create_connection(("127.0.0.1", 9), timeout=1).close()
        except OSError as exc:
            log.warning("reward service unreachable (try %d): %s; retrying", tries, exc)
            time.sleep(0.0005)


def ask_nobody() -> None:
    """A helper command that prompts and waits for an answer that never comes."""
    prompt = "printf 'overwrite the checkpoint? [y/N] ' >&2; read answer"
    subprocess.Popen(["sh", "-c", prompt], stdin=subprocess.PIPE).wait()


def deadlock_with_own_thread() -> None:
    """A lock-order deadlock inside the rank: the metrics thread holds the step lock and waits
    for the flush lock, which the main thread holds while it waits for the step lock."""
    step_lock, flush_lock = threading.Lock(), threading.Lock()
    flush_lock.acquire()

    def flush_metrics() -> None:
        with step_lock, flush_lock:
            pass

    threading.Thread(target=flush_metrics, name="metrics", daemon=True).start()
    time.sleep(0.1)
    with step_lock:
        pass


def freeze_soon(delay: float) -> None:
    """Stop this whole process a moment from now, while the main thread sits in a collective,
    and again at once whenever something continues it (nvidia-resiliency-ext's rank monitor
    sends SIGCONT before its termination signal): a rank stuck for good."""

    def stop() -> None:
        time.sleep(delay)
        while True:
            os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(0.05)

    threading.Thread(target=stop, daemon=True).start()


def freeze_node() -> None:
    """Stop every process of this Slurm job on this node, this one last: the node is gone for
    its peers, its sockets open and silent (a killed node's would be closed at once)."""
    job, node = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURMD_NODENAME")
    if not job or not node:
        sys.exit("demo.hang=node_lost needs a multi-node Slurm job (areal-launch slurm)")
    for process in psutil.process_iter():
        try:
            if process.uids().real != os.getuid():  # only this job's user's: never another's
                continue
            env = process.environ()
            same = env.get("SLURM_JOB_ID") == job and env.get("SLURMD_NODENAME") == node
            if same and process.pid != os.getpid() and process.name() != "slurmstepd":
                process.suspend()
        except psutil.Error:
            continue
    os.kill(os.getpid(), signal.SIGSTOP)


def step_line(step: int, total: int) -> str:
    now = datetime.datetime.now().strftime("%Y%m%d-%H:%M:%S.%f")[:-3]
    return (
        f"{GREEN}(AReaL) {now} StatsLogger INFO:{RESET} Epoch 1/1 Step {step}/{total} "
        f"Train step {step}/{total} done."
    )


def resume_point(checkpoint: str) -> int:
    """The last finished step of the run this one resumes (0: a fresh start)."""
    if not checkpoint or not os.environ.get("AREAL_WATCHDOG_RESUME_ATTEMPT"):
        return 0
    try:
        with open(checkpoint) as fh:
            return int(json.load(fh)["step"])
    except (OSError, ValueError, KeyError):
        return 0


def save_checkpoint(checkpoint: str, step: int) -> None:
    with open(f"{checkpoint}.tmp", "w") as fh:
        json.dump({"step": step}, fh)
    os.replace(f"{checkpoint}.tmp", checkpoint)


def hung_before(settings: dict) -> bool:
    """A transient hang (``hang_once``) that already happened: its marker says so. Every rank
    asks at start, before the misbehaving rank can write the marker."""
    return settings["hang_once"] and os.path.exists(f"{settings['checkpoint']}.hung")


def mark_hung(settings: dict) -> None:
    if settings["hang_once"]:
        open(f"{settings['checkpoint']}.hung", "w").close()


def batches(loader: DataLoader, replay: Replay | None, record: bool, rank: int):  # noqa: ANN201
    """(step, (x, y)): the recorded steps in a replay, else the loader's, recorded if asked."""
    if replay is not None:
        for step, groups in replay.batches():
            yield step, (groups[0]["x"], groups[0]["y"])
        return
    recorder = TrajectoryRecorder.from_env(rank, dist.get_world_size()) if record else None
    for step, (x, y) in enumerate(loader, start=1):
        if recorder is not None:
            recorder.record(step, [{"x": x, "y": y}])
        yield step, (x, y)
    if recorder is not None:
        recorder.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    args = parser.parse_args()
    with open(args.config) as fh:
        config = yaml.safe_load(fh)
    settings = {
        "steps": 10,
        "step_time": 0.2,
        "hang": "none",
        "hang_step": 3,
        "hang_rank": 1,
        "pause_step": -1,
        "pause_time": 0.0,
        "slow_step": -1,
        "slow_time": 0.0,
        "slow_rank": -1,
        "heartbeat": False,
        "checkpoint": "",
        "hang_once": False,
        "teardown_time": 0.0,
        "record": False,
        "phases": "",
        "phase_time": 20.0,
        "phase_mb": 100,
        "phase_rank": 0,
        "eval_ranks": -1,
        "phase_url": "",
        "shard_dir": "",
    }
    settings.update(config.get("demo") or {})
    rank = int(os.environ["RANK"])
    if settings["log_env"] and rank == 0:  # what many training scripts do, secrets and all
        print("environment:", " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())))
    hang_ranks = settings["hang_rank"]
    misbehaving_rank = rank in (hang_ranks if isinstance(hang_ranks, list) else [hang_ranks])
    if settings["hang"] == "init_deadlock" and misbehaving_rank:
        time.sleep(10**6)  # stuck loading a checkpoint before joining the process group
    timeout = float(os.environ.get("AREAL_WATCHDOG_COLLECTIVE_TIMEOUT", "900"))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    steps = int(settings["steps"])
    block = (
        settings["hang_step"] - 1
        if settings["hang"] == "dataloader_stall" and misbehaving_rank
        else None
    )
    loader = DataLoader(RandomRegression(steps, block), batch_size=1, num_workers=1)
    if hung_before(settings):
        settings["hang"] = "none"  # transient: it happened once, not again
    replay = Replay.from_env(dp_rank=rank, dp_size=dist.get_world_size())
    if replay is not None:
        settings["checkpoint"] = ""  # a replay never moves the run's own checkpoint
    start = resume_point(settings["checkpoint"])
    slow_phases, shard = phases.parse(settings["phases"]), phases.prepare(settings, rank)
    if rank == 0 and start:
        print(f"resuming from {settings['checkpoint']}: {start} steps done", flush=True)
    with Trainer(settings) as trainer:
        for step, (x, y) in batches(loader, replay, settings["record"], rank):
            if step <= start:
                continue
            Trainer.is_hang_step = step == settings["hang_step"]
            misbehave = settings["hang"] if Trainer.is_hang_step and misbehaving_rank else None
            if misbehave and misbehave != "none":
                mark_hung(settings)
            if step == settings["pause_step"]:
                with areal_watchdog.expect_pause(settings["pause_time"] * 3, "saving checkpoint"):
                    time.sleep(settings["pause_time"])
            if step == settings["slow_step"] and settings["slow_rank"] in (-1, rank):
                time.sleep(settings["slow_time"])  # slow, unannounced, and then fine again
            if step in slow_phases:  # silent, slow, healthy (phases.py)
                phases.run(slow_phases[step], settings, rank, shard)
            if settings["shard_dir"]:
                phases.read_next(settings["shard_dir"], rank, step)
            time.sleep(settings["step_time"])
            if misbehave == "cleanup_deadlock":
                break  # a rank-local early-stopping decision: the others go on
            loss = trainer.step(x, y, misbehave)
            if settings["heartbeat"]:
                areal_watchdog.heartbeat(step)
            if rank == 0:
                print(step_line(step, steps), f"loss={loss:.4f}", flush=True)
                if settings["checkpoint"]:
                    save_checkpoint(settings["checkpoint"], step)
        if rank == 0:
            time.sleep(settings["teardown_time"])  # the final save, while the peers wait
    if rank == 0:
        print("Training completes! Total time elapsed 0.", flush=True)


if __name__ == "__main__":
    main()
