"""A small but real RL loop on CPU (GRPO-style) with DDP over gloo, recording every rollout batch.

Each step: the "rollout engine" samples ``group_size`` completions per prompt from the current
policy (a tiny next-token model), a reward scores them (the share of even tokens), advantages are
normalised within each group, groups whose rewards are all equal are filtered out (they carry no
signal: dynamic sampling), and a clipped policy-gradient loss trains the policy.

The data-dependent bug: a prompt that already fills the context leaves no room to generate, so
all its completions are empty, its rewards all equal, and the group is filtered out. When every
group of one rank is filtered, that rank skips ``backward`` (nothing to learn) and goes straight
to the metrics ``all_reduce`` while its peers wait in DDP's gradient all_reduce inside
``backward``: a hang. ``data.long_prompt_step`` / ``data.long_prompt_rank`` put such prompts in
one rank's share of one step.

With ``areal-launch --watchdog`` every batch is recorded (``areal_watchdog.trajectory``);
``areal-launch replay RUN_DIR`` feeds the recorded batches back with the rollout engine never
started.
"""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from torch.nn.parallel import DistributedDataParallel

from areal_watchdog.trajectory import Replay, TrajectoryRecorder
from areal_watchdog.trajectory.format import ENV_REPLAY_SOURCE

VOCAB, EOS = 16, 0
GREEN, RESET = "\x1b[32m", "\x1b[0m"


class Policy(torch.nn.Module):
    """Next-token logits from the current and the previous token."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.prev = torch.nn.Embedding(VOCAB, 32)
        self.head = torch.nn.Linear(32, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        prev = torch.nn.functional.pad(ids[:, :-1], (1, 0))
        return self.head(torch.tanh(self.embed(ids) + self.prev(prev)))


class RolloutEngine:
    """Stands in for AReaL's inference servers: samples completions from a policy snapshot."""

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        print(f"[rank {os.environ['RANK']}] rollout engine started", flush=True)

    def prompts(self, step: int, rank: int) -> list[list[int]]:
        cfg = self.cfg
        gen = torch.Generator().manual_seed(cfg["seed"] * 1000 + step * 17 + rank)
        long = step == cfg["long_prompt_step"] and rank == cfg["long_prompt_rank"]
        length = cfg["max_len"] if long else cfg["prompt_len"]
        return [
            torch.randint(1, VOCAB, (length,), generator=gen).tolist()
            for _ in range(cfg["groups_per_rank"])
        ]

    @torch.no_grad()
    def generate(self, policy: Policy, step: int, rank: int) -> list[dict[str, torch.Tensor]]:
        cfg = self.cfg
        gen = torch.Generator().manual_seed(cfg["seed"] * 7919 + step * 31 + rank)
        batch = []
        for prompt in self.prompts(step, rank):
            size, max_len = cfg["group_size"], cfg["max_len"]
            ids = torch.zeros(size, max_len, dtype=torch.long)
            ids[:, : len(prompt)] = torch.tensor(prompt)
            loss_mask = torch.zeros(size, max_len, dtype=torch.int32)
            logprobs = torch.zeros(size, max_len)
            lengths = torch.full((size,), len(prompt))
            done = torch.zeros(size, dtype=torch.bool)
            for pos in range(len(prompt), max_len):
                probs = F.softmax(policy(ids[:, :pos])[:, -1], dim=-1)
                token = torch.multinomial(probs, 1, generator=gen).squeeze(1)
                token[done] = EOS
                live = ~done
                ids[live, pos] = token[live]
                loss_mask[live, pos] = 1
                logprobs[live, pos] = probs[live, token[live]].log()
                lengths[live] += 1
                done |= token == EOS
            completion = ids * loss_mask
            even = ((completion % 2 == 0) & (completion != EOS) & (loss_mask == 1)).sum(1)
            rewards = even.float() / loss_mask.sum(1).clamp(min=1)
            batch.append(
                {
                    "input_ids": ids.to(torch.int32),
                    "loss_mask": loss_mask,
                    "logprobs": logprobs,
                    "versions": torch.full((size, max_len), step - 1, dtype=torch.int32),
                    "attention_mask": torch.arange(max_len)[None, :] < lengths[:, None],
                    "rewards": rewards,
                }
            )
        return batch


def filter_groups(batch: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """Dynamic sampling: a group whose rewards are all equal has zero advantage everywhere."""
    return [g for g in batch if g["rewards"].std() > 0]


def ppo_loss(
    model: torch.nn.Module, groups: list[dict[str, torch.Tensor]], clip: float
) -> torch.Tensor:
    losses = []
    for group in groups:
        ids = group["input_ids"].long()
        mask = group["loss_mask"][:, 1:].float()
        rewards = group["rewards"]
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        logits = model(ids)[:, :-1]
        new = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        ratio = torch.exp(new - group["logprobs"][:, 1:])
        adv = advantages[:, None]
        surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
        losses.append(-(surrogate * mask).sum() / mask.sum().clamp(min=1))
    return torch.stack(losses).mean()


def step_line(step: int, total: int, loss: float) -> str:
    now = datetime.datetime.now().strftime("%Y%m%d-%H:%M:%S.%f")[:-3]
    return (
        f"{GREEN}(AReaL) {now} StatsLogger INFO:{RESET} Epoch 1/1 Step {step}/{total} "
        f"Train step {step}/{total} done. loss={loss:.8f}"
    )


DEFAULTS = {  # the config's `data` and `rl` sections override these
    "seed": 1,
    "steps": 6,
    "prompt_len": 3,
    "max_len": 8,
    "group_size": 4,
    "groups_per_rank": 2,
    "lr": 0.05,
    "clip": 0.2,
    "long_prompt_step": -1,
    "long_prompt_rank": 0,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    args = parser.parse_args()
    with open(args.config) as fh:
        config = yaml.safe_load(fh)
    cfg = {**DEFAULTS, **(config.get("data") or {}), **(config.get("rl") or {})}
    run_dir = Path(config["cluster"]["fileroot"]) / config["experiment_name"] / config["trial_name"]
    timeout = float(os.environ.get("AREAL_WATCHDOG_COLLECTIVE_TIMEOUT", "900"))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg["seed"])
    model = DistributedDataParallel(Policy())
    metrics_group = dist.new_group(backend="gloo")  # statistics travel apart from gradients
    optim = torch.optim.Adam(model.parameters(), lr=cfg["lr"])

    replay = Replay.from_env(dp_rank=rank, dp_size=world)
    if replay is not None:
        steps = replay.steps
        if steps[0] > 1:  # start from the original run's weights after the previous step
            source = Path(os.environ[ENV_REPLAY_SOURCE]) / "checkpoints" / f"step_{steps[0] - 1}.pt"
            state = torch.load(source, weights_only=True)
            model.module.load_state_dict(state["model"])
            optim.load_state_dict(state["optim"])
        print(f"[rank {rank}] rollout engine disabled: replaying steps {steps}", flush=True)
        batches = replay.batches()
    else:
        engine = RolloutEngine(cfg)
        recorder = TrajectoryRecorder.from_env(dp_rank=rank, dp_size=world)
        steps = list(range(1, cfg["steps"] + 1))

        def rollouts():
            for step in steps:
                batch = engine.generate(model.module, step, rank)
                if recorder is not None:
                    recorder.record(step, batch)
                yield step, batch

        batches = rollouts()

    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    for step, batch in batches:
        groups = filter_groups(batch)
        local = torch.zeros(2)
        if groups:  # BUG: a rank with nothing to learn skips backward and its DDP all_reduce
            loss = ppo_loss(model, groups, cfg["clip"])
            optim.zero_grad()
            loss.backward()
            optim.step()
            local = torch.tensor([loss.item() * len(groups), float(len(groups))])
        dist.all_reduce(local, group=metrics_group)
        mean_loss = (local[0] / local[1].clamp(min=1)).item()
        if rank == 0:
            torch.save(
                {"model": model.module.state_dict(), "optim": optim.state_dict()},
                run_dir / "checkpoints" / f"step_{step}.pt",
            )
            print(step_line(step, steps[-1], mean_loss), flush=True)
    if replay is None and recorder is not None:
        recorder.close()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print("Training completes! Total time elapsed 0.", flush=True)


if __name__ == "__main__":
    main()
