"""GRPO on GSM8K with AReaL: AReaL's own ``examples/math/gsm8k_rl.py``, three changes.

The changes: rollouts run ``tool_workflow.ToolRLVRWorkflow`` (AReaL's ``RLVRWorkflow`` plus a
calculator tool) instead of ``areal.workflow.rlvr.RLVRWorkflow``, or another workflow
(``AREAL_EXAMPLE_WORKFLOW``, e.g. ``agent_workflow.AgentWorkflow``); the reward function may be
another one (``AREAL_EXAMPLE_REWARD_FN``, an import string, as AReaL names reward functions);
and AReaL's single controller waits up to 300 s, not its fixed 60 s, for a worker it forks
(``patient_worker_forks``). Everything else is AReaL's example as shipped. Run it the way
AReaL's docs do, watched::

    areal-launch --watchdog local examples/areal/gsm8k_grpo.yaml
"""

import os
import sys

from areal import PPOTrainer
from areal.api.cli_args import GRPOConfig, load_expr_config
from areal.dataset import get_custom_dataset
from areal.utils.hf_utils import load_hf_tokenizer


def patient_worker_forks(seconds: float = 300.0) -> None:
    """AReaL's local scheduler gives a forked worker (the eval-rollout one) a fixed 60 s to
    answer ``/health`` (``areal/infra/scheduler/local.py``, ``_wait_for_fork_ready``). Its
    imports alone take 10 s on an idle core: on a test machine running three AReaL jobs on two
    cores they took longer, and the job failed before its first step (CI, twice)."""
    try:
        from areal.infra.scheduler.local import LocalScheduler
    except ImportError:
        return
    wait = LocalScheduler.__dict__.get("_wait_for_fork_ready")
    if not isinstance(wait, staticmethod):
        return
    inner = wait.__func__

    async def patient(session, host, port, timeout=seconds):
        return await inner(session, host, port, max(timeout, seconds))

    LocalScheduler._wait_for_fork_ready = staticmethod(patient)


def main(args):
    patient_worker_forks()
    config, _ = load_expr_config(args, GRPOConfig)
    tokenizer = load_hf_tokenizer(config.tokenizer_path)

    train_dataset = get_custom_dataset(
        split="train",
        dataset_config=config.train_dataset,
        tokenizer=tokenizer,
    )
    valid_dataset = get_custom_dataset(
        split="test",
        dataset_config=config.valid_dataset,
        tokenizer=tokenizer,
    )

    workflow_kwargs = dict(
        reward_fn=os.environ.get("AREAL_EXAMPLE_REWARD_FN", "areal.reward.gsm8k.gsm8k_reward_fn"),
        gconfig=config.gconfig,
        tokenizer=config.tokenizer_path,
        enable_thinking=False,
    )
    eval_workflow_kwargs = workflow_kwargs.copy()
    eval_workflow_kwargs["gconfig"] = config.gconfig.new(temperature=0.6)

    workflow = os.environ.get("AREAL_EXAMPLE_WORKFLOW", "tool_workflow.ToolRLVRWorkflow")
    with PPOTrainer(
        config,
        train_dataset=train_dataset,
        valid_dataset=valid_dataset,
    ) as trainer:
        trainer.train(
            workflow=workflow,
            workflow_kwargs=workflow_kwargs,
            eval_workflow=workflow,
            eval_workflow_kwargs=eval_workflow_kwargs,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
