"""Make everything an AReaL GRPO run needs that would otherwise come from a model hub, offline.

There is no model hub here, so this builds, in a few seconds on a CPU:

- a tokenizer (byte-level BPE trained with the ``tokenizers`` library on the dataset's own text,
  with Qwen's chat markers ``<|im_start|>``/``<|im_end|>`` and a chat template);
- a tiny Qwen2 causal LM with random weights (2 layers, hidden size 32), saved with
  ``save_pretrained`` beside the tokenizer, so ``AutoModelForCausalLM.from_pretrained`` and
  ``AutoTokenizer.from_pretrained`` load it as they would a real checkpoint; it ships modelling
  code of its own (``modeling_tiny.py``, through ``auto_map``), which AReaL's trainer runs;
- a GSM8K-shaped dataset (``question``/``answer`` ending ``#### N``) in the layout AReaL's
  ``gsm8k`` loader reads with ``datasets.load_dataset(path, name="main")``;
- ``site/``: a folder for ``PYTHONPATH`` that holds the ``sglang`` stand-in
  (``examples/inference_server/fake_sglang``, linked), so AReaL starts our CPU server.

Two data-dependent hangs, one per side:

- rollout: rows whose ``question`` starts with ``POISON`` make the workflow's calculator tool hang
  (``examples/areal/tool_workflow.py``); ``--poison-from K`` poisons rows K, K+1, ...;
- training: rows that hold the document separator ``<|doc_sep|>`` make the trainer's forward pass
  spin (``modeling_tiny.py``); ``--train-poison-from K`` marks rows K, K+1, ...

And three that are not hangs of the model's own, each marked the same way:

- ``--train-raise-from K``: rows with ``<|bad_sample|>``, which the trainer's forward pass
  refuses with an exception on the DP rank that gets them (an early exit from the loop);
- ``--slow-tool-from K``: rows whose calculator answers only after
  ``AREAL_EXAMPLE_SLOW_TOOL_S`` seconds (slow, not stuck);
- ``--no-score-from K``: rows whose reward function never returns (``rewards.py``).

``python make_tiny.py OUT_DIR [--rows N] [--poison-from K] [--poison-count C]
[--train-poison-from K] [--train-poison-count C] [--train-raise-from K]
[--slow-tool-from K] [--slow-tool-count C] [--no-score-from K]``
prints the paths it made.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

DOC_SEP = "<|doc_sep|>"
BAD_SAMPLE = "<|bad_sample|>"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", DOC_SEP, BAD_SAMPLE]
MODELLING = Path(__file__).with_name("modeling_tiny.py")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
POISON = "POISON"
SLOW_TOOL = "SLOWTOOL"  # the calculator answers, but only after AREAL_EXAMPLE_SLOW_TOOL_S
NO_SCORE = "NOSCORE"  # the reward function never returns (examples/areal/rewards.py)
README = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train.jsonl
  - split: test
    path: main/test.jsonl
---
A GSM8K-shaped toy dataset made offline by areal-watchdog's CPU harness (make_tiny.py).
"""


def rows(count: int, seed: int, marks: dict[str, range]) -> list[dict[str, str]]:
    """Arithmetic word problems in GSM8K's shape; the rows in each range of ``marks`` carry
    that mark (a prefix word, or a special token inside the question)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        question = f"Tom has {a} apples and buys {b} more. How many apples does Tom have?"
        for mark, marked_rows in marks.items():
            if i not in marked_rows:
                continue
            if mark.startswith("<|"):
                question = question.replace(". ", f".{mark}", 1)
            else:
                question = f"{mark} {question}"
        out.append({"question": question, "answer": f"{a} + {b} = {a + b}\n#### {a + b}"})
    return out


def write_dataset(root: Path, data: list[dict[str, str]]) -> Path:
    """``root/gsm8k``: AReaL picks its gsm8k loader when the path contains "gsm8k"."""
    path = root / "gsm8k"
    (path / "main").mkdir(parents=True, exist_ok=True)
    (path / "README.md").write_text(README)
    for split, part in (("train", data), ("test", data[:8])):
        lines = "".join(json.dumps(row) + "\n" for row in part)
        (path / "main" / f"{split}.jsonl").write_text(lines)
    return path


def make_tokenizer(texts: list[str]):
    """A byte-level BPE tokenizer with Qwen's chat markers, trained on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    core.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
    )


def make_model(tokenizer, path: Path, seed: int, shape: str = "tiny") -> None:
    """A 2-layer Qwen2 with random weights, saved with its tokenizer; ``tiny`` (hidden 32,
    head_dim 8) ships its own modelling code, ``vllm`` is a standard Qwen2 whose head_dim (64:
    hidden 128, 2 heads) vLLM's CPU attention takes (it refuses 16 and below)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    hidden, heads = (128, 2) if shape == "vllm" else (32, 4)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    if shape != "vllm":
        model.config.auto_map = {"AutoModelForCausalLM": "modeling_tiny.TinyQwen2ForCausalLM"}
        model.config.doc_sep_token_id = tokenizer.convert_tokens_to_ids(DOC_SEP)
        model.config.bad_sample_token_id = tokenizer.convert_tokens_to_ids(BAD_SAMPLE)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if shape != "vllm":
        (path / MODELLING.name).write_text(MODELLING.read_text())


def link_site(root: Path) -> Path:
    """``root/site``: links to the sglang stand-in package and its version record."""
    fake = Path(__file__).resolve().parents[2] / "inference_server" / "fake_sglang"
    site = root / "site"
    site.mkdir(parents=True, exist_ok=True)
    for item in fake.iterdir():
        link = site / item.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(item)
    return site


def marked(start: int | None, count: int) -> range:
    """Rows ``start`` .. ``start + count - 1``, or none."""
    return range(start, start + count) if start is not None else range(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--poison-from", type=int, default=None)
    parser.add_argument("--poison-count", type=int, default=4)
    parser.add_argument("--train-poison-from", type=int, default=None)
    parser.add_argument("--train-poison-count", type=int, default=1)
    parser.add_argument("--train-raise-from", type=int, default=None)
    parser.add_argument("--slow-tool-from", type=int, default=None)
    parser.add_argument("--slow-tool-count", type=int, default=4)
    parser.add_argument("--no-score-from", type=int, default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--shape", choices=("tiny", "vllm"), default="tiny",
        help="vllm: a standard Qwen2 with head_dim 64, which vLLM's CPU build serves",
    )  # fmt: skip
    args = parser.parse_args(argv)
    marks = {
        POISON: marked(args.poison_from, args.poison_count),
        DOC_SEP: marked(args.train_poison_from, args.train_poison_count),
        BAD_SAMPLE: marked(args.train_raise_from, 1),
        SLOW_TOOL: marked(args.slow_tool_from, args.slow_tool_count),
        NO_SCORE: marked(args.no_score_from, 4),
    }
    data = rows(args.rows, args.seed, marks)
    dataset = write_dataset(args.out, data)
    texts = [r["question"] + "\n" + r["answer"] for r in data] + [CHAT_TEMPLATE]
    model = args.out / "tiny-qwen2"
    make_model(make_tokenizer(texts), model, args.seed, args.shape)
    site = link_site(args.out)
    print(json.dumps({"model": str(model), "dataset": str(dataset), "site": str(site)}))


if __name__ == "__main__":
    main()
