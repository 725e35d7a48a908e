"""GSM8K's reward, except for samples of rows marked ``NOSCORE`` (``harness/make_tiny.py``):
there the reward function never returns, as a reward that calls a remote judge or a sandbox can.

AReaL runs reward functions in a process pool under a timeout (``AsyncRewardWrapper``: 15 s,
3 retries), then scores the sample 0 without a word in the training statistics. Chosen by
``examples/areal/gsm8k_rl.py`` when ``AREAL_EXAMPLE_REWARD_FN=rewards.gsm8k_or_never``.
"""

from __future__ import annotations

import time

from areal.reward.gsm8k import gsm8k_reward_fn

NO_SCORE = "NOSCORE"


def gsm8k_or_never(prompt, completions, prompt_ids, completion_ids, answer, **kwargs) -> float:
    """The GSM8K reward, or no answer at all."""
    if NO_SCORE in prompt:
        time.sleep(10**6)
    return gsm8k_reward_fn(prompt, completions, prompt_ids, completion_ids, answer, **kwargs)
