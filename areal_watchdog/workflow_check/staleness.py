"""AReaL's staleness gate before the first weight update, as numbers: how many episode groups
each rollout worker may start at version 0, against its share of one batch.

``StalenessManager.get_capacity`` (both releases): ``(max_head_offpolicyness + version + 1) x
consumer_batch_size - (accepted + running)``, each worker's ``consumer_batch_size`` being
``max(1, consumer_batch_size // dp)`` (``WorkflowExecutor.initialize``). No weights move before
the first batch is in, so when a worker's share of that batch is larger, the rest of it waits
for the gate forever: in training as in the guide's third step. ``max_concurrent_rollouts`` only
delays (AReaL clamps each worker's share to at least 1): it is no trap."""

from __future__ import annotations

from dataclasses import dataclass

from areal_watchdog.common.json_dataclass import PlainRecord


@dataclass(frozen=True)
class Staleness(PlainRecord):
    """The config's numbers (``None``: AReaL's default applied) and what they allow."""

    batch_size: int
    n_samples: int
    dp: int
    consumer_batch_size: int
    max_head_offpolicyness: int
    max_concurrent_rollouts: int | None

    @property
    def per_worker_consumer(self) -> int:
        return max(1, self.consumer_batch_size // self.dp)

    @property
    def allowed(self) -> int:
        """Groups one worker may start before the weights' version moves."""
        return max(0, (self.max_head_offpolicyness + 1) * self.per_worker_consumer)

    @property
    def share(self) -> int:
        """One worker's share of a batch, in groups (prompts)."""
        return -(-self.batch_size // self.dp)

    @property
    def at_once(self) -> int:
        """Groups one worker runs at once: the concurrency limit, within the gate."""
        limit = self.max_concurrent_rollouts or self.consumer_batch_size
        return max(1, min(max(1, limit // self.dp), self.allowed or 1, self.share))

    @property
    def trapped(self) -> bool:
        return self.allowed < self.share

    def sentence(self) -> str:
        """The gate in words, with the numbers that make it."""
        workers = f"{self.dp} rollout worker{'s' if self.dp > 1 else ''}"
        gate = (
            f"rollout.max_head_offpolicyness {self.max_head_offpolicyness} and "
            f"rollout.consumer_batch_size {self.consumer_batch_size} over {workers} let each "
            f"worker start ({self.max_head_offpolicyness} + 0 + 1) x {self.per_worker_consumer}"
            f" = {self.allowed} group{'s' if self.allowed != 1 else ''} before the weights' "
            f"version moves; its share of a batch is {self.share} (train_dataset.batch_size "
            f"{self.batch_size} over {self.dp})"
        )
        if not self.trapped:
            return f"{gate}: no trap"
        left = self.share - self.allowed
        waiting = "no episode ever starts" if self.allowed == 0 else (
            f"the other {left} wait{'s' if left == 1 else ''} for the staleness gate forever"
        )  # fmt: skip
        return (
            f"{gate}, so {waiting}: raise rollout.max_head_offpolicyness or "
            "rollout.consumer_batch_size (training's first batch waits the same way)"
        )
