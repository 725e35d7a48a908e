"""Rollout consistency: how far the inference engine's log-probs of the trained tokens are from
what the trainer computes for the same tokens with the same weights (AReaL's debugging guide,
"Rollout consistency"). Plain numbers in, plain records out: the command loads the dumps and the
weights (``trajectory.rollout_consistency.recompute``), this module only compares.

AReaL's convention (``areal/workflow/rlvr.py``, both releases): in a dumped sequence
``logprobs[i]`` is the engine's log-prob of token ``input_ids[i]``, 0 on the prompt, and
``loss_mask[i]`` is 1 on the generated tokens; ``versions[i]`` is the weights' version that
generated token ``i`` (-1 on the prompt). The trainer's log-prob of token ``i`` comes from the
logits at ``i - 1`` (``torch.roll(input_ids, -1)`` in ``fsdp_engine.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# A token whose two log-probs differ by more than this counts as diverging (nats).
DEFAULT_THRESHOLD = 0.5
# A gap this large on average is more than numerics (dtype, kernels): something differs.
LARGE_MEAN_GAP = 0.1
WORST_SHOWN = 3
WORST_WORTH_SHOWING = 1e-3  # smaller gaps are numerics: no token is named for them


@dataclass(frozen=True)
class SequenceTokens:
    """One dumped sequence's trained tokens: their ids, both log-probs and their versions, with
    where the sequence came from (group and sample) and its whole token ids for decoding."""

    group: int
    sample: int
    ids: list[int]  # the whole sequence
    positions: list[int]  # where the trained tokens are in ``ids``
    engine: list[float]
    trainer: list[float]
    versions: list[int]


@dataclass(frozen=True)
class Divergence:
    """The token of a sequence where the two sides differ most."""

    group: int
    sample: int
    position: int
    token: int
    engine: float
    trainer: float
    ids: list[int]

    @property
    def gap(self) -> float:
        return abs(self.engine - self.trainer)


@dataclass(frozen=True)
class StepConsistency:
    """One step's comparison, and what may explain a large gap."""

    step: int
    tokens: int
    mean_abs: float
    max_abs: float
    kl: float  # E_engine[exp(r) - 1 - r], r = trainer - engine (Schulman's k3: never negative)
    over_threshold: float  # the share of tokens whose gap passes the threshold
    gaps: list[float] = field(repr=False)
    worst: list[Divergence] = field(default_factory=list)
    unchecked: int = 0  # trained tokens of versions whose weights were not found
    flags: list[str] = field(default_factory=list)


def compare_step(
    step: int,
    sequences: list[SequenceTokens],
    threshold: float = DEFAULT_THRESHOLD,
    unchecked: int = 0,
    truncated: int = 0,
) -> StepConsistency:
    """The step's figures over every compared token; ``unchecked`` and ``truncated`` (sequences
    cut at the length limit) only feed the flags."""
    gaps = [abs(e - t) for s in sequences for e, t in zip(s.engine, s.trainer, strict=True)]
    ratios = [t - e for s in sequences for e, t in zip(s.engine, s.trainer, strict=True)]
    count = len(gaps)
    mean_abs = sum(gaps) / count if count else 0.0
    result = StepConsistency(
        step=step,
        tokens=count,
        mean_abs=mean_abs,
        max_abs=max(gaps, default=0.0),
        kl=sum(math.expm1(r) - r for r in ratios) / count if count else 0.0,
        over_threshold=sum(g > threshold for g in gaps) / count if count else 0.0,
        gaps=gaps,
        worst=_worst(sequences),
        unchecked=unchecked,
    )
    return _flagged(result, sequences, truncated)


def _worst(sequences: list[SequenceTokens]) -> list[Divergence]:
    found = []
    for seq in sequences:
        if not seq.engine:
            continue
        i = max(range(len(seq.engine)), key=lambda k: abs(seq.engine[k] - seq.trainer[k]))
        pos = seq.positions[i]
        found.append(Divergence(seq.group, seq.sample, pos, seq.ids[pos], seq.engine[i],
                                seq.trainer[i], seq.ids))  # fmt: skip
    found = [d for d in found if d.gap >= WORST_WORTH_SHOWING]
    return sorted(found, key=lambda d: -d.gap)[:WORST_SHOWN]


def _flagged(
    result: StepConsistency, sequences: list[SequenceTokens], truncated: int
) -> StepConsistency:
    """What usually explains a gap, from the numbers: versions, truncation, the prompt."""
    flags = []
    if result.unchecked:
        flags.append(
            f"{result.unchecked} trained token(s) came from weights this node does not hold "
            "(their version's checkpoint: enable saver or recover, or pass --weights): not "
            "compared (version skew)"
        )
    if len({v for s in sequences for v in s.versions}) > 1:
        flags.append("the step mixes tokens of several weight versions (off-policy rollouts)")
    if result.tokens and result.mean_abs > LARGE_MEAN_GAP:
        first = _first_token_gap(sequences)
        rest = _later_gap(sequences)
        if first > 5 * max(rest, 1e-6):
            flags.append(
                f"the gap sits on the first generated token ({first:.3f} there, {rest:.3f} "
                "later): the engine saw another prompt than the dump holds (a chat template "
                "mismatch?)"
            )
        else:
            flags.append(
                f"a mean gap of {result.mean_abs:.3f} is more than numerics: the engine's "
                "weights differ from these (another revision, a missed weight update, another "
                "dtype or temperature)"
            )
    if truncated:
        flags.append(
            f"{truncated} sequence(s) reach the engine's context length: the engine may have "
            "cut what it saw, so its log-probs may be of another context than the dump's"
        )
    return StepConsistency(**{**result.__dict__, "flags": flags})


def _first_token_gap(sequences: list[SequenceTokens]) -> float:
    firsts = [abs(s.engine[0] - s.trainer[0]) for s in sequences if s.engine]
    return sum(firsts) / len(firsts) if firsts else 0.0


def _later_gap(sequences: list[SequenceTokens]) -> float:
    later = [
        abs(e - t) for s in sequences for e, t in zip(s.engine[1:], s.trainer[1:], strict=True)
    ]
    return sum(later) / len(later) if later else 0.0


def histogram(gaps: list[float], edges: tuple[float, ...]) -> list[int]:
    """How many gaps fall below each edge and above the one before (the last bin: the rest)."""
    counts = [0] * (len(edges) + 1)
    for gap in gaps:
        counts[next((i for i, edge in enumerate(edges) if gap < edge), len(edges))] += 1
    return counts
