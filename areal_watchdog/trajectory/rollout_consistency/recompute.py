"""The trainer's side of the rollout-consistency check: every trained token's log-prob
recomputed with ``transformers`` from the weights of the version that generated it.

Which weights hold version ``v`` (AReaL, both releases: after step ``g`` the weights become
version ``g + 1``, ``rl_trainer.py``): version 0 is the config's ``actor.path``; version ``v``
is the ``saver``'s Hugging Face checkpoint of global step ``v - 1``
(``<fileroot>/checkpoints/<user>/<experiment>/<trial>/default/epoch*epochstep*globalstep{v-1}``),
else AReaL's recover checkpoint when it holds step ``v - 1`` (AReaL keeps the newest: after a
hang, the weights that generated the hung step), as the replay loads it. That one is a torch
distributed checkpoint of ``DCPState`` (``{"dcp": {"model": ..., "optim": ...}}``) without a
model config: the model is built from ``actor.path``'s config and only its ``dcp.model``
tensors are read. ``--weights`` names one folder (either kind) for every version instead."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException

from areal_watchdog.common.errors import UserError
from areal_watchdog.rundir.secure import check_ancestors
from areal_watchdog.trajectory.replay.areal_replay import (
    checkpoint_root,
    recover_info_dir,
    recovered_step,
)
from areal_watchdog.trajectory.rollout_consistency.consistency import SequenceTokens

WeightsOf = Callable[[int], Path | None]


def weights_of(raw: dict[str, Any], override: Path | None) -> WeightsOf:
    """Where the weights of a version are, or None when this node holds none."""
    if override is not None:
        return lambda _version: override
    initial = actor_path(raw)
    root = checkpoint_root(raw.get("saver"))
    saved = root / "default" if root else None  # the actor's (the critic's: "critic")
    recover = recover_checkpoint(raw)

    def find(version: int) -> Path | None:
        if version <= 0:
            return initial
        found = sorted(saved.glob(f"epoch*epochstep*globalstep{version - 1}")) if saved else []
        hf = next((p for p in found if (p / "config.json").is_file()), None)
        if hf is None and recover is not None and recover[0] == version - 1:
            return recover[1]
        return hf

    return find


def actor_path(raw: dict[str, Any]) -> Path | None:
    """``actor.path``: the initial weights, and the model config of weights saved without one."""
    actor = raw.get("actor") if isinstance(raw.get("actor"), dict) else {}
    return Path(str(actor["path"])) if actor.get("path") else None


def recover_checkpoint(raw: dict[str, Any]) -> tuple[int, Path] | None:
    """(the global step it holds, its folder) of the run's recover checkpoint, if one is here."""
    info = recover_info_dir(raw)
    step = recovered_step(info) if info else None
    root = checkpoint_root(raw.get("recover"))
    if step is None or root is None:
        return None
    path = root / "default" / "recover_checkpoint"
    return (step, path) if is_distributed_checkpoint(path) else None


def is_distributed_checkpoint(path: Path) -> bool:
    return (path / ".metadata").is_file() and not (path / "config.json").is_file()


class Recomputer:
    """Loads each weights folder once (float32, CPU unless a GPU is there) and scores
    sequences with it at the actor's temperature."""

    def __init__(self, weights: WeightsOf, temperature: float, base: Path | None = None) -> None:
        self.weights, self.temperature, self.base = weights, temperature, base
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
                if is_distributed_checkpoint(path):
                    model = self._from_distributed(path)
                else:
                    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            except (OSError, ValueError, RuntimeError, CheckpointException) as exc:
                first = _last_reason(exc)
                raise UserError(f"{path}: cannot load the weights ({first[:200]})") from None
            self.models[path] = model.to(self.device).eval()
        return self.models[path]

    def _from_distributed(self, path: Path) -> Any:
        """AReaL's recover checkpoint: the model ``actor.path`` describes, its tensors read from
        the checkpoint's ``dcp.model`` (the optimizer's are left on disk)."""
        import torch.distributed.checkpoint as dcp
        from transformers import AutoModelForCausalLM

        if self.base is None:
            raise UserError(f"{path}: a distributed checkpoint needs the model's config from "
                            "actor.path, which the run's config does not set")  # fmt: skip
        # its .metadata is unpickled: only from folders no other user could have written
        check_ancestors(path, "run check-consistency as the user who launched the run")
        model = AutoModelForCausalLM.from_pretrained(self.base, dtype=torch.float32)
        state = {"dcp": {"model": model.state_dict()}}
        planner = dcp.DefaultLoadPlanner(allow_partial_load=True)
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, checkpoint_id=str(path), planner=planner)
        model.load_state_dict(state["dcp"]["model"])
        return model

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


def _last_reason(exc: BaseException) -> str:
    """One line: a distributed checkpoint's error ends with the reason, others start with it."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[-1] if isinstance(exc, CheckpointException) else lines[0]


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
