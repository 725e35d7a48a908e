"""``check-consistency --generate N``: AReaL's ``cmp_rollout.py`` on the run's own prompts.
The first N dumped prompts go to a live server and to ``transformers``, both greedy and for the
same number of tokens (end of sequence ignored), and the token ids are compared: identical, or
where they part. The server is asked through vLLM's OpenAI completions
(``return_tokens_as_token_ids``) or, when it has none, SGLang's ``/generate``."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from areal_watchdog.common.errors import UserError
from areal_watchdog.common.interprocess.http import OPENER
from areal_watchdog.trajectory.rollout_consistency.recompute import Recomputer, group_rows

TIMEOUT = 300.0  # seconds per request: a loaded server queues it


@dataclass(frozen=True)
class GreedyPair:
    """One prompt's greedy continuations from the engine and from ``transformers``."""

    prompt: list[int]
    engine: list[int]
    trainer: list[int]

    @property
    def parts_at(self) -> int | None:
        """The first generated token that differs (a shorter side ends there), or None."""
        for index, (a, b) in enumerate(zip(self.engine, self.trainer, strict=False)):
            if a != b:
                return index
        shorter = min(len(self.engine), len(self.trainer))
        return None if len(self.engine) == len(self.trainer) else shorter


def dumped_prompts(groups: list[dict[str, Any]], count: int) -> list[list[int]]:
    """The first ``count`` distinct prompts of the step (the tokens before the first trained
    one of each group's first sample): a batch may hold one prompt in several groups, and a
    prompt compared twice says nothing new. Fewer when the step holds fewer."""
    prompts: list[list[int]] = []
    for group in groups:
        row = group_rows(group)[0]
        mask = row["loss_mask"]
        prompt = row["input_ids"][: mask.index(1) if 1 in mask else len(mask)]
        if prompt not in prompts:
            prompts.append(prompt)
        if len(prompts) == count:
            break
    return prompts


def compare(
    recompute: Recomputer, weights: Path, server: str, prompts: list[list[int]], tokens: int
) -> list[GreedyPair]:
    """Each prompt's greedy tokens from the server at ``server`` (host:port) and from
    ``transformers`` with ``weights``."""
    return [
        GreedyPair(
            p, server_greedy(server, p, tokens), trainer_greedy(recompute, weights, p, tokens)
        )
        for p in prompts
    ]


def trainer_greedy(
    recompute: Recomputer, weights: Path, prompt: list[int], tokens: int
) -> list[int]:
    model = recompute.model(weights)
    ids = torch.tensor([prompt], device=recompute.device)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=tokens, min_new_tokens=tokens)  # fmt: skip
    return out[0, len(prompt) :].tolist()


def server_greedy(address: str, prompt: list[int], tokens: int) -> list[int]:
    """The server's greedy tokens: OpenAI completions first, then SGLang's ``/generate``."""
    openai = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
              "logprobs": 0, "return_tokens_as_token_ids": True}  # fmt: skip
    status, body = _post(address, "/v1/completions", openai)
    if status == 200:
        found = body["choices"][0]["logprobs"]["tokens"]
        return [int(str(t).split(":", 1)[1]) for t in found]
    greedy = {"temperature": 0, "max_new_tokens": tokens, "ignore_eos": True}
    sglang = {"input_ids": prompt, "return_logprob": True, "sampling_params": greedy}
    status, body = _post(address, "/generate", sglang)
    if status != 200:
        raise UserError(f"--server {address}: neither /v1/completions nor /generate answered "
                        f"(HTTP {status}): is it an inference server?")  # fmt: skip
    return [int(entry[1]) for entry in body["meta_info"]["output_token_logprobs"]]


def _post(address: str, path: str, payload: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"http://{address}{path}", data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with OPENER.open(request, timeout=TIMEOUT) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (OSError, ValueError) as exc:
        raise UserError(f"--server {address}: no answer ({exc})") from None
