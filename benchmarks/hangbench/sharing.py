"""Which tools read one run of a case, and which readings a tool's action in that run cut short.

PyTorch's three rows ask the same of a job (torchrun, the harness, a collective timeout) and
differ only in the timeout's length, so one run, with the shortest of their timeouts, serves
them all: ``torchfrtrace`` is the tuned timeout's own dumps, read another way. Until that timeout
fires nothing in the run differs from a run with a longer one. When it fires (a rank raises and
torchrun ends the others), a row with a longer timeout that had neither signalled nor seen its
window close is cut: it gets a run of its own. Every other tool (the watchdog, each
``ft_launcher`` configuration) always runs alone.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Protocol

from benchmarks.hangbench.runs import Run
from benchmarks.hangbench.tools import Signal, torch_errors

TIMED_OUT = re.compile(r"(?i)timed? ?out")  # gloo's "Timed out waiting 60000ms for recv"
TAIL_S = 5.0  # a run whose tools have all signalled goes on this long: a later step shows


class Tool(Protocol):
    name: str
    share: str  # tools with the same ``share`` read one run
    timeout_s: float | None  # the collective timeout it sets (None: it sets none)
    early_end: bool  # its signal can be read as the run goes on

    def signal(self, run: Run) -> Signal | None: ...


def groups(tools: Sequence[Tool]) -> list[list[Tool]]:
    """The tools in runs of their own: one list per run, in the order given."""
    by_share: dict[str, list[Tool]] = {}
    for tool in tools:
        by_share.setdefault(tool.share, []).append(tool)
    return list(by_share.values())


def acted_at(run: Run) -> float | None:
    """When the run's collective timeout first fired in a rank (None: it never did)."""
    return min((at for at, error in torch_errors(run) if TIMED_OUT.search(error)), default=None)


def cut(tool: Tool, group: Sequence[Tool], signal: Signal | None, closes: float | None,
        acted: float | None) -> bool:  # fmt: skip
    """Whether another tool's action ended this tool's reading of the run before it had its
    answer: its timeout is longer than the run's, the run's fired before this tool signalled,
    and before its window closed (``closes``: None for a healthy case, whose window is the
    job)."""
    timeouts = [t.timeout_s for t in group if t.timeout_s is not None]
    if acted is None or tool.timeout_s is None or tool.timeout_s <= min(timeouts):
        return False
    if signal is not None and signal.at < acted:
        return False
    return closes is None or closes > acted


def settled(group: Sequence[Tool], run: Run) -> bool:
    """Whether the run can end now: every tool in it can be read as it goes and has signalled,
    ``TAIL_S`` ago (nothing later changes a score but a step that contradicts the label)."""
    if not all(t.early_end for t in group):
        return False
    signals = [t.signal(run) for t in group]
    if any(s is None for s in signals):
        return False
    return max(s.at for s in signals if s) + TAIL_S < time.time()
