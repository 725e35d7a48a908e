"""The tiny model's own modelling code: the data-dependent *training-side* hang of the harness.

Many hub models ship code of their own (``auto_map`` in ``config.json``); AReaL's trainer runs
it (``trust_remote_code=True``) while the inference server runs its own implementation of the
architecture (SGLang does; so does our stand-in, which loads the plain Qwen2). This one is Qwen2
plus position ids that restart after a document separator, with a bug: the scan resumes *at* the
separator it found, so a sequence that holds one never leaves the loop. The rollout of such a
sample is fine; the trainer's first forward pass over it spins forever on the DP rank that got
it, and its peers wait in FSDP's all-gather. The dumped batch holds the sample, so a replay
hangs the same way.

``make_tiny.py`` copies this file beside the weights; rows made with ``--train-poison-from``
hold the separator. Rows made with ``--train-raise-from`` hold another marker the model refuses
with an exception: the DP rank that gets such a sample leaves AReaL's training loop early (AReaL
issue #684's shape) while its peers go on.
"""

from __future__ import annotations

import torch
from transformers import Qwen2ForCausalLM


def restart_positions(input_ids: torch.Tensor, position_ids: torch.Tensor | None, sep: int):
    """Position ids that start again after each separator (the bug: see the module text)."""
    flat = input_ids.reshape(-1).tolist()
    if sep not in flat:
        return position_ids
    restarted, start = [], 0
    while start < len(flat):
        end = flat.index(sep, start) if sep in flat[start:] else len(flat)
        restarted.extend(range(end - start))
        start = end  # should be end + 1: a separator is found again, forever
    return torch.tensor(restarted, dtype=torch.long).reshape(input_ids.shape)


class TinyQwen2ForCausalLM(Qwen2ForCausalLM):
    """Qwen2 with document-restarting position ids."""

    def forward(self, input_ids=None, position_ids=None, **kwargs):
        refused = getattr(self.config, "bad_sample_token_id", None)
        if input_ids is not None and refused is not None and bool((input_ids == refused).any()):
            raise ValueError("the tiny model cannot take a sample with <|bad_sample|>")
        sep = getattr(self.config, "doc_sep_token_id", None)
        if input_ids is not None and sep is not None:
            position_ids = restart_positions(input_ids, position_ids, sep)
        return super().forward(input_ids=input_ids, position_ids=position_ids, **kwargs)
