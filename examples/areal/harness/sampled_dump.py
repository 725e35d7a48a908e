"""A run directory as an AReaL run under ``--watchdog`` leaves it, without AReaL: the tiny
model (``make_tiny.py``) samples three GSM8K-like groups token by token in float32 on the CPU,
as our SGLang stand-in does, keeping the sampler's log-prob of each token (AReaL's
``logprobs``), and the groups are dumped as steps 0 and 1 beside the run's resolved config.
``areal-launch check-consistency`` then scores them; on another device (a GPU) the gap it finds
is that device's numerics.

    python sampled_dump.py MODEL_DIR ROOT      # prints the run directory it made
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import yaml

PROMPTS = [[5, 17, 23, 9], [7, 7, 31], [12, 40, 41, 42, 3]]
NEW_TOKENS = 6


def sampled_group(model: torch.nn.Module, prompt: list[int], samples: int) -> dict:
    """One AReaL group: prompt + sampled tokens, the sampler's log-prob of each (0 on the
    prompt), loss_mask on the generated tokens, version 0, right-padded."""
    rows = []
    generator = torch.Generator().manual_seed(len(prompt))
    for _ in range(samples):
        ids, logprobs = list(prompt), [0.0] * len(prompt)
        for _ in range(NEW_TOKENS):
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            dist = torch.log_softmax(logits, dim=-1)
            token = int(torch.multinomial(dist.exp(), 1, generator=generator))
            ids.append(token)
            logprobs.append(float(dist[token]))
        rows.append((ids, logprobs))
    width = max(len(ids) for ids, _ in rows) + 1  # one pad column
    pad = lambda values, fill: values + [fill] * (width - len(values))  # noqa: E731
    generated = lambda ids: [0] * len(prompt) + [1] * (len(ids) - len(prompt))  # noqa: E731
    return {
        "input_ids": torch.tensor([pad(ids, 0) for ids, _ in rows]),
        "attention_mask": torch.tensor([pad([1] * len(ids), 0) for ids, _ in rows]),
        "loss_mask": torch.tensor([pad(generated(ids), 0) for ids, _ in rows]),
        "logprobs": torch.tensor([pad(lp, 0.0) for _, lp in rows]),
        "versions": torch.tensor([pad([-1] * len(prompt) + [0] * NEW_TOKENS, -1) for _ in rows]),
        "rewards": torch.tensor([1.0] * samples),
    }


def write_run(model_dir: Path, root: Path) -> Path:
    """``ROOT/gsm8k-grpo/trial0`` with its config and steps 0 (3 groups) and 1 (2 groups)."""
    from transformers import AutoModelForCausalLM

    run = root / "gsm8k-grpo" / "trial0"
    (run / "watchdog").mkdir(parents=True, mode=0o700)
    config = {"experiment_name": "gsm8k-grpo", "trial_name": "trial0",
              "cluster": {"fileroot": str(root), "n_nodes": 1, "n_gpus_per_node": 0},
              "launch": {"entrypoint": "train.py"}, "tokenizer_path": str(model_dir),
              "actor": {"path": str(model_dir), "temperature": 1.0}}  # fmt: skip
    (run / "watchdog" / "launch_config.yaml").write_text(yaml.safe_dump(config))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    dumps = run / "debug_trajectories"
    dumps.mkdir()
    for step in (0, 1):
        batch = [sampled_group(model, p, samples=2) for p in PROMPTS[step:]]
        torch.save(batch, dumps / f"step_{step:06d}_dp_0.pt")
    return run


if __name__ == "__main__":
    print(write_run(Path(sys.argv[1]), Path(sys.argv[2])))
