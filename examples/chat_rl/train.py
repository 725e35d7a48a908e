"""A GRPO-style loop over a chat dataset, written as a user would from docs/recovery.md and
docs/trajectory.md: torchrun, data-parallel on gloo, the script's own checkpoint every step,
every batch recorded (``TrajectoryRecorder``), replays fed from the dump (``Replay``), and a
resumed run that leaves quarantined rows out of its data (``without_quarantined``).

Each row is ``{"messages": [system, user], "answer": ...}``, the system message the same for
every row. Each step every rank takes ``rl.groups_per_rank`` rows (one group each, ``group_size``
sampled completions); their prompts are the chat template's text, tokenized with the run's own
tokenizer (``tokenizer_path``).

Two bugs, for ``on_hang: resume`` to meet:

- ``data.poisoned`` (row indices): those rows ask about an image the reward verifier cannot
  read, so their rewards are NaN, and a rank with a NaN reward skips its update (and the
  gradient all_reduce) while its peers wait in it: a hang that follows the data.
- ``rl.eval_step``: at that step rank ``rl.eval_rank`` evaluates and broadcasts the result,
  alone: a hang keyed on the step, whatever the data.

Run it through ``areal-launch --watchdog local examples/chat_rl/config.yaml`` from the
repository root.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from tokenizers import Tokenizer

from areal_watchdog.trajectory import Replay, TrajectoryRecorder
from areal_watchdog.trajectory.format import ENV_REPLAY_SOURCE
from areal_watchdog.trajectory.quarantine import without_quarantined

SYSTEM = "You are a careful math tutor. Answer with the number only, nothing else."
GREEN, RESET = "\x1b[32m", "\x1b[0m"


def make_rows(count: int, poisoned: list[int], seed: int) -> list[dict]:
    """The dataset: chat rows sharing one system message."""
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        question = f"Question {index}: what is {a} plus {b}?"
        if index in poisoned:
            question += " Read the numbers from the attached [image] first."
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        rows.append({"messages": messages, "answer": str(a + b)})
    return rows


def chat_text(row: dict) -> str:
    return "".join(f"<|{m['role']}|>{m['content']}\n" for m in row["messages"]) + "<|assistant|>"


class Policy(torch.nn.Module):
    """Next-token logits from the current and the previous token."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, 32)
        self.prev = torch.nn.Embedding(vocab, 32)
        self.head = torch.nn.Linear(32, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        prev = F.pad(ids[:, :-1], (1, 0))
        return self.head(torch.tanh(self.embed(ids) + self.prev(prev)))


def reward(row: dict, completion: list[int]) -> float:
    """The verifier: the share of even tokens; a question about an image cannot be scored."""
    if "[image]" in row["messages"][-1]["content"]:
        return float("nan")
    return sum(1 for t in completion if t % 2 == 0) / max(1, len(completion))


@torch.no_grad()
def rollout(policy: Policy, tokenizer: Tokenizer, row: dict, cfg: dict, seed: int) -> dict:
    """One group: ``group_size`` sampled completions of the row's prompt."""
    prompt = tokenizer.encode(chat_text(row), add_special_tokens=False).ids
    size, length = cfg["group_size"], len(prompt) + cfg["max_new"]
    ids = torch.zeros(size, length, dtype=torch.long)
    ids[:, : len(prompt)] = torch.tensor(prompt)
    loss_mask, logprobs = torch.zeros(size, length, dtype=torch.int32), torch.zeros(size, length)
    gen = torch.Generator().manual_seed(seed)
    for pos in range(len(prompt), length):
        probs = F.softmax(policy(ids[:, :pos])[:, -1], dim=-1)
        token = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        ids[:, pos], loss_mask[:, pos] = token, 1
        logprobs[:, pos] = probs.gather(1, token[:, None]).squeeze(1).log()
    rewards = [reward(row, ids[i, len(prompt) :].tolist()) for i in range(size)]
    return {
        "input_ids": ids.to(torch.int32),
        "loss_mask": loss_mask,
        "logprobs": logprobs,
        "versions": torch.zeros(size, length, dtype=torch.int32),
        "attention_mask": torch.ones(size, length, dtype=torch.bool),
        "rewards": torch.tensor(rewards),
    }


def ppo_loss(model: torch.nn.Module, groups: list[dict], clip: float = 0.2) -> torch.Tensor:
    losses = []
    for group in groups:
        ids, mask = group["input_ids"].long(), group["loss_mask"][:, 1:].float()
        rewards = group["rewards"]
        advantages = ((rewards - rewards.mean()) / (rewards.std() + 1e-6))[:, None]
        new = torch.log_softmax(model(ids)[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        ratio = torch.exp(new - group["logprobs"][:, 1:])
        surrogate = torch.min(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages)
        losses.append(-(surrogate * mask).sum() / mask.sum().clamp(min=1))
    return torch.stack(losses).mean()


class Trainer:
    """Data-parallel over gloo (gradients averaged by hand); statistics travel in a process
    group of their own."""

    def __init__(self, vocab: int, cfg: dict) -> None:
        self.cfg, self.rank = cfg, dist.get_rank()
        torch.manual_seed(cfg["seed"])
        self.model = Policy(vocab)
        self.optim = torch.optim.Adam(self.model.parameters(), lr=cfg["lr"])
        self.metrics = dist.new_group(backend="gloo")

    def step(self, step: int, groups: list[dict]) -> float:
        local = torch.zeros(2)
        # BUG: a rank with a reward it cannot score skips its update, and with it the
        # gradient all_reduce that its peers wait in
        if all(torch.isfinite(g["rewards"]).all() for g in groups):
            loss = ppo_loss(self.model, groups)
            self.optim.zero_grad()
            loss.backward()
            self.average_gradients()
            self.optim.step()
            local = torch.tensor([loss.item(), 1.0])
        if step == self.cfg["eval_step"] and self.rank == self.cfg["eval_rank"]:
            self.evaluate()
        return self.sync_metrics(local)

    def average_gradients(self) -> None:
        for param in self.model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= dist.get_world_size()

    def evaluate(self) -> None:
        """BUG: an evaluation on one rank only, which shares its score with the others."""
        dist.broadcast(torch.zeros(1), src=self.rank)

    def sync_metrics(self, local: torch.Tensor) -> float:
        dist.all_reduce(local, group=self.metrics)
        return (local[0] / local[1].clamp(min=1)).item()

    def save(self, directory: Path, step: int) -> None:
        """Rank 0: the weights after ``step``, and which step is the newest."""
        state = {"model": self.model.state_dict(), "optim": self.optim.state_dict()}
        torch.save(state, directory / f"step_{step}.pt")
        (directory / "latest.json").write_text(json.dumps({"step": step}))

    def load(self, path: Path) -> None:
        state = torch.load(path, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optim.load_state_dict(state["optim"])


def step_line(step: int, total: int, loss: float) -> str:
    now = datetime.datetime.now().strftime("%Y%m%d-%H:%M:%S.%f")[:-3]
    return (
        f"{GREEN}(AReaL) {now} StatsLogger INFO:{RESET} Epoch 1/1 Step {step}/{total} "
        f"Train step {step}/{total} done. loss={loss:.6f}"
    )


def resumed_after(checkpoints: Path) -> int:
    """The last step of the run this one resumes (0: a fresh start)."""
    if not os.environ.get("AREAL_WATCHDOG_RESUME_ATTEMPT"):
        return 0
    try:
        return int(json.loads((checkpoints / "latest.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    config = yaml.safe_load(Path(parser.parse_args().config).read_text())
    cfg = {"seed": 1, "rows": 64, "poisoned": [], "steps": 5, "groups_per_rank": 2,
           "group_size": 4, "max_new": 4, "lr": 0.05, "eval_step": -1, "eval_rank": 1,
           "step_time": 0.2, **(config.get("data") or {}), **(config.get("rl") or {})}  # fmt: skip
    run_dir = Path(config["cluster"]["fileroot"]) / config["experiment_name"] / config["trial_name"]
    checkpoints = run_dir / "checkpoints"
    timeout = float(os.environ.get("AREAL_WATCHDOG_COLLECTIVE_TIMEOUT", "900"))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    tokenizer = Tokenizer.from_file(str(Path(config["tokenizer_path"]) / "tokenizer.json"))
    trainer = Trainer(tokenizer.get_vocab_size(), cfg)

    replay = Replay.from_env(dp_rank=rank, dp_size=world)
    if replay is not None:  # the launcher replays dumped steps: no rollout, the run's weights
        if replay.steps[0] > 1:
            trainer.load(Path(os.environ[ENV_REPLAY_SOURCE]) / "checkpoints" /
                         f"step_{replay.steps[0] - 1}.pt")  # fmt: skip
        batches = replay.batches()
    else:
        start = resumed_after(checkpoints)
        if start:
            trainer.load(checkpoints / f"step_{start}.pt")
            if rank == 0:
                print(f"resuming from {checkpoints}: {start} steps done", flush=True)
        rows = without_quarantined(make_rows(cfg["rows"], cfg["poisoned"], cfg["seed"]))
        batches = rollouts(trainer, tokenizer, rows, cfg, start + 1)

    checkpoints.mkdir(parents=True, exist_ok=True)
    for step, groups in batches:
        time.sleep(cfg["step_time"])
        loss = trainer.step(step, groups)
        if rank == 0:
            trainer.save(checkpoints, step)
            print(step_line(step, cfg["steps"], loss), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print("Training completes! Total time elapsed 0.", flush=True)


def rollouts(trainer: Trainer, tokenizer: Tokenizer, rows: list[dict], cfg: dict, first: int):  # noqa: ANN201
    """(step, this rank's groups) from ``first`` on, each batch recorded before it trains."""
    rank, world = dist.get_rank(), dist.get_world_size()
    recorder = TrajectoryRecorder.from_env(dp_rank=rank, dp_size=world)
    per_step, mine = cfg["groups_per_rank"] * world, cfg["groups_per_rank"]
    for step in range(first, cfg["steps"] + 1):
        start = (step - 1) * per_step + rank * mine
        batch = [rollout(trainer.model, tokenizer, row, cfg, seed=step * 1000 + start + i)
                 for i, row in enumerate(rows[start : start + mine])]  # fmt: skip
        if recorder is not None:
            recorder.record(step, batch)
        yield step, batch
    if recorder is not None:
        recorder.close()


if __name__ == "__main__":
    main()
