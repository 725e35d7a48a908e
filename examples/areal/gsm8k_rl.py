"""GRPO on GSM8K with AReaL: AReaL's own ``examples/math/gsm8k_rl.py``, three changes.

The changes: rollouts run ``tool_workflow.ToolRLVRWorkflow`` (AReaL's ``RLVRWorkflow`` plus a
calculator tool) instead of ``areal.workflow.rlvr.RLVRWorkflow``, or another workflow
(``AREAL_EXAMPLE_WORKFLOW``, e.g. ``agent_workflow.AgentWorkflow``); the reward function may be
another one (``AREAL_EXAMPLE_REWARD_FN``, an import string, as AReaL names reward functions);
AReaL's single controller waits up to 300 s, not its fixed 60 s, for a worker it forks
(``patient_worker_forks``); and ``AREAL_EXAMPLE_SILENT_SAVE=STEP:MB:SECONDS`` makes the save of
that global step write MB megabytes more, in fsync'd 1 MB chunks over SECONDS, with no log line
(``silent_save``: a large model's checkpoint on a slow filesystem). Everything else is AReaL's
example as shipped. Run it the way
AReaL's docs do, watched::

    areal-launch --watchdog local examples/areal/gsm8k_grpo.yaml
"""

import os
import sys
import tempfile
import time

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


def silent_save() -> None:
    """AReaL's ``Saver.save`` (called by the trainer at every step; it saves when its frequency
    says so), which at ``AREAL_EXAMPLE_SILENT_SAVE``'s step first writes for as long as asked."""
    spec = os.environ.get("AREAL_EXAMPLE_SILENT_SAVE")
    if not spec:
        return
    from areal.utils.saver import Saver

    at, megabytes, seconds = spec.split(":")
    original = Saver.save

    def save(self, engine, epoch, step, global_step, *args, **kwargs):
        if global_step == int(at):
            with tempfile.TemporaryFile(dir=self.config.fileroot) as fh:
                for _ in range(int(megabytes)):
                    fh.write(os.urandom(1 << 20))
                    fh.flush()
                    os.fsync(fh.fileno())
                    time.sleep(float(seconds) / int(megabytes))
        return original(self, engine, epoch, step, global_step, *args, **kwargs)

    Saver.save = save


def main(args):
    patient_worker_forks()
    silent_save()
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
