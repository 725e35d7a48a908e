"""An AReaL experiment config as the launcher reads it, without importing AReaL (it pulls in
torch): which launch mode fits the training script, and how large each allocation is.

AReaL 1.0 decides its mode from ``AREAL_SPMD_MODE`` alone (``areal/utils/environ.py``): a script
run plainly is a *single controller* that starts every worker through its scheduler; under
AReaL's SPMD launchers (``AREAL_SPMD_MODE=1``) every torchrun rank trains and the inference
servers were started first. A script that does not import AReaL is run under torchrun as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_IMPORTS_AREAL = re.compile(r"^\s*(?:from|import)\s+areal\b", re.M)
_DIMENSION = re.compile(r"([dptce])(\d+)")


def imports_areal(script: str) -> bool:
    """Whether a training script is written for AReaL (it imports ``areal``)."""
    try:
        return bool(_IMPORTS_AREAL.search(Path(script).read_text(errors="replace")))
    except OSError:
        return False


def resolve_mode(requested: str, entrypoint: str) -> str:
    """``auto``: single controller for an AReaL script (AReaL 1.0's recommended mode), torchrun
    for anything else."""
    if requested != "auto":
        return requested
    return "single_controller" if imports_areal(entrypoint) else "torchrun"


@dataclass(frozen=True)
class Allocation:
    """One engine's allocation string (``fsdp:d2p1t1``, ``sglang:d4t2``)."""

    backend: str
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def instance_size(self) -> int:
        """Devices one inference server spans (tensor x pipeline parallel)."""
        return self.tp * self.pp


def parse_allocation(spec: str) -> Allocation | None:
    """``None`` for a string this simple reader does not understand (AReaL's hybrid MoE forms
    with parentheses): the caller then says which key to set by hand."""
    backend, _, dims = spec.strip().rpartition(":")
    if "(" in dims or not dims:
        return None
    sizes = {k: int(v) for k, v in _DIMENSION.findall(dims)}
    if "".join(f"{k}{v}" for k, v in _DIMENSION.findall(dims)) != dims.replace(" ", ""):
        return None
    return Allocation(
        backend or "", sizes.get("d", 1), sizes.get("t", 1), sizes.get("p", 1), sizes.get("c", 1)
    )
