"""``areal-launch check-consistency``: a run directory as an AReaL run leaves it (its resolved
config, its dumped steps in AReaL's layout), whose engine log-probs come from the real tiny model
sampling token by token, as our SGLang stand-in does. Scored against those weights it is
consistent; against another revision of them (another seed) it is flagged and exits 1. Bad input
is one line. The real AReaL runs check theirs in tests/test_areal.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from conftest import REPO

pytestmark = pytest.mark.slow  # makes two models and runs transformers in subprocesses

MAKE_TINY = REPO / "examples" / "areal" / "harness" / "make_tiny.py"
PROMPTS = [[5, 17, 23, 9], [7, 7, 31], [12, 40, 41, 42, 3]]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "areal_watchdog.cli", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The tiny Qwen2 of the AReaL harness, made offline with two seeds (two revisions)."""
    made = {}
    for seed in (1, 2):
        root = tmp_path_factory.mktemp(f"tiny-{seed}")
        subprocess.run([sys.executable, str(MAKE_TINY), str(root), "--rows", "8", "--seed",
                        str(seed)], check=True, capture_output=True)  # fmt: skip
        made[seed] = root / "tiny-qwen2"
    return made


def sampled_group(model: torch.nn.Module, prompt: list[int], samples: int) -> dict:
    """One AReaL group: prompt + sampled tokens, the sampler's log-prob of each (0 on the
    prompt), loss_mask on the generated tokens, version 0, right-padded."""
    rows = []
    generator = torch.Generator().manual_seed(len(prompt))
    for _ in range(samples):
        ids, logprobs = list(prompt), [0.0] * len(prompt)
        for _ in range(6):
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
        "versions": torch.tensor([pad([-1] * len(prompt) + [0] * 6, -1) for ids, _ in rows]),
        "rewards": torch.tensor([1.0] * samples),
    }


@pytest.fixture(scope="module")
def run_dir(models: dict[int, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("consistency")
    run = root / "gsm8k-grpo" / "trial0"
    (run / "watchdog").mkdir(parents=True, mode=0o700)
    config = {"experiment_name": "gsm8k-grpo", "trial_name": "trial0",
              "cluster": {"fileroot": str(root), "n_nodes": 1, "n_gpus_per_node": 0},
              "launch": {"entrypoint": "train.py"}, "tokenizer_path": str(models[1]),
              "actor": {"path": str(models[1]), "temperature": 1.0}}  # fmt: skip
    (run / "watchdog" / "launch_config.yaml").write_text(yaml.safe_dump(config))
    model = AutoModelForCausalLM.from_pretrained(models[1], torch_dtype=torch.float32).eval()
    dumps = run / "debug_trajectories"
    dumps.mkdir()
    for step in (0, 1):
        batch = [sampled_group(model, p, samples=2) for p in PROMPTS[step:]]
        torch.save(batch, dumps / f"step_{step:06d}_dp_0.pt")
    return run


def test_an_engine_that_sampled_from_these_weights_is_consistent(run_dir: Path) -> None:
    done = cli("check-consistency", str(run_dir))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "rollout consistency, temperature 1 (gaps in nats)"
    rows = {int(line.split()[0]): line.split() for line in lines if line[:1].isdigit()}
    assert sorted(rows) == [0, 1]
    assert rows[0][1] == "36" and rows[1][1] == "24"  # tokens: 3 and 2 groups of 2 x 6
    assert all(float(row[3]) < 1e-3 for row in rows.values()), done.stdout  # max |gap|
    assert "flag:" not in done.stdout
    plot = run_dir / "consistency" / "steps-0-1.svg"
    assert f"plot: {plot}" in done.stdout and plot.read_text().startswith("<svg")
    assert "step 0: 6 sequences scored" in done.stderr


def test_another_revision_of_the_weights_is_flagged(
    run_dir: Path, models: dict[int, Path], tmp_path: Path
) -> None:
    plot = tmp_path / "other.svg"
    done = cli("check-consistency", str(run_dir), "--steps", "1", "--weights", str(models[2]),
               "--plot", str(plot))  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "flag: a mean gap of " in done.stdout and "another revision" in done.stdout
    assert "  worst: group " in done.stdout
    assert plot.read_text().count("<rect") == 8  # one bar per bin, one step


def test_bad_input_is_one_line(run_dir: Path, tmp_path: Path) -> None:
    for args, said in (
        (["--steps", "7"], "--steps: no dump of step 7 in "),
        (["--steps", "x"], "--steps x: not a list of steps (e.g. 0,2-3)"),
        (["--weights", str(tmp_path)], f"{tmp_path}: cannot load the weights ("),
    ):
        done = cli("check-consistency", str(run_dir), *args)
        (line,) = done.stderr.strip().splitlines()[-1:]
        assert done.returncode == 2 and said in line, done.stderr
        assert "Traceback" not in done.stderr
    empty = tmp_path / "e" / "t"
    (empty / "watchdog").mkdir(parents=True, mode=0o700)
    (empty / "watchdog" / "launch_config.yaml").write_text(
        (run_dir / "watchdog" / "launch_config.yaml").read_text()
    )
    done = cli("check-consistency", str(empty))
    assert done.returncode == 2
    assert done.stderr.strip().endswith("debug_trajectories: no complete trajectory dump to check")
