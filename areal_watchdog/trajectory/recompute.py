"""The trainer's side of the rollout-consistency check: every trained token's log-prob
recomputed with ``transformers`` from the weights of the version that generated it.

Which weights hold version ``v`` (AReaL, both releases: after step ``g`` the weights become
version ``g + 1``, ``rl_trainer.py``): version 0 is the config's ``actor.path``; version ``v``
is the ``saver``'s Hugging Face checkpoint of global step ``v - 1``
(``<fileroot>/checkpoints/<user>/<experiment>/<trial>/default/epoch*epochstep*globalstep{v-1}``).
AReaL's recover checkpoint is a torch distributed checkpoint without a model config: not read
here. ``--weights`` names one folder for every version instead."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from areal_watchdog.common.errors import UserError
from areal_watchdog.trajectory.areal_replay import checkpoint_root
from areal_watchdog.trajectory.consistency import SequenceTokens

WeightsOf = Callable[[int], Path | None]


def weights_of(raw: dict[str, Any], override: Path | None) -> WeightsOf:
    """Where the weights of a version are, or None when this node holds none."""
    if override is not None:
        return lambda _version: override
    actor = raw.get("actor") if isinstance(raw.get("actor"), dict) else {}
    initial = Path(str(actor.get("path"))) if actor.get("path") else None
    root = checkpoint_root(raw.get("saver"))
    saved = root / "default" if root else None  # the actor's (the critic's: "critic")

    def find(version: int) -> Path | None:
        if version <= 0:
            return initial
        if saved is None:
            return None
        found = sorted(saved.glob(f"epoch*epochstep*globalstep{version - 1}"))
        return next((p for p in found if (p / "config.json").is_file()), None)

    return find


class Recomputer:
    """Loads each weights folder once (float32, CPU unless a GPU is there) and scores
    sequences with it at the actor's temperature."""

    def __init__(self, weights: WeightsOf, temperature: float) -> None:
        self.weights, self.temperature = weights, temperature
        self.models: dict[Path, Any] = {}
        self.device = "cuda" if torch.cuda.is_available() else "cpu"

    @property
    def device_name(self) -> str:
        """``cpu``, or ``cuda (NVIDIA H200)``: where the trainer's side was computed."""
        return f"cuda ({torch.cuda.get_device_name()})" if self.device == "cuda" else "cpu"

    def model(self, path: Path) -> Any:
        if path not in self.models:
            from transformers import AutoModelForCausalLM
            from transformers.utils import logging

            logging.set_verbosity_error()
            logging.disable_progress_bar()
            try:
                model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            except (OSError, ValueError) as exc:
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise UserError(f"{path}: cannot load the weights ({first[:200]})") from None
            self.models[path] = model.to(self.device).eval()
        return self.models[path]

    def token_logprobs(self, path: Path, ids: list[int]) -> list[float]:
        """The log-prob of each token after the first, given the tokens before it."""
        tokens = torch.tensor([ids], device=self.device)
        with torch.no_grad():
            logits = self.model(path)(input_ids=tokens).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits / self.temperature, dim=-1)
        return logprobs.gather(-1, tokens[0, 1:, None])[:, 0].tolist()

    def group(self, index: int, group: dict[str, Any]) -> tuple[list[SequenceTokens], int]:
        """The group's sequences with both sides' log-probs of their trained tokens, and how
        many trained tokens had no weights here."""
        rows, unchecked = [], 0
        for sample, row in enumerate(group_rows(group)):
            seq, missing = self._sequence(index, sample, row)
            rows.append(seq)
            unchecked += missing
        return rows, unchecked

    def _sequence(
        self, group: int, sample: int, row: dict[str, list]
    ) -> tuple[SequenceTokens, int]:
        ids, mask, engine, versions = (
            row["input_ids"],
            row["loss_mask"],
            row["logprobs"],
            row["versions"],
        )
        trained = [i for i in range(1, len(ids)) if mask[i]]
        scored: dict[int, float] = {}
        missing = 0
        for version in sorted({versions[i] for i in trained}):
            path = self.weights(version)
            at = [i for i in trained if versions[i] == version]
            if path is None:
                missing += len(at)
                continue
            logprobs = self.token_logprobs(path, ids)
            scored.update({i: logprobs[i - 1] for i in at})
        kept = [i for i in trained if i in scored]
        return SequenceTokens(
            group, sample, ids, kept, [engine[i] for i in kept], [scored[i] for i in kept],
            [versions[i] for i in kept],
        ), missing  # fmt: skip


def group_rows(group: dict[str, Any]) -> list[dict[str, list]]:
    """A dumped group's sequences, cut to their length (``attention_mask``), as lists."""
    for key in ("input_ids", "loss_mask", "logprobs"):
        if not isinstance(group.get(key), torch.Tensor):
            raise UserError(f"a dumped group has no {key} tensor: not an AReaL rollout batch")
    ids = group["input_ids"]
    ids = ids if ids.dim() == 2 else ids[None]

    def tensor(key: str, default: int) -> torch.Tensor:
        value = group.get(key)
        if not isinstance(value, torch.Tensor):
            return torch.full_like(ids, default)
        return value if value.dim() == 2 else value[None]

    attention = tensor("attention_mask", 1)
    rows = []
    for n in range(ids.shape[0]):
        length = int(attention[n].sum())
        rows.append({
            "input_ids": ids[n, :length].tolist(),
            "loss_mask": tensor("loss_mask", 0)[n, :length].tolist(),
            "logprobs": tensor("logprobs", 0)[n, :length].float().tolist(),
            "versions": tensor("versions", 0)[n, :length].tolist(),
        })  # fmt: skip
    return rows
