"""Will the sidecar see this node's GPUs? The configured backend opened as the sidecar opens it
(``evidence.gpu``); no GPU is a warning, unless the config asks for GPUs."""

from __future__ import annotations

import shutil

from areal_watchdog.doctor.model import FAIL, PASS, WARN, Check
from areal_watchdog.evidence.gpu import NvmlBackend, open_backend

NVML_FIX = "install the NVIDIA driver and `pip install nvidia-ml-py` in the sidecar's venv"


def check_gpus(backend: str, recording: str | None, needed: int) -> Check:
    """The GPUs the sidecar would sample, by count, against ``cluster.n_gpus_per_node``."""
    if backend in ("none", "recorded"):
        return Check("gpus", PASS, f"watchdog.gpu.backend: {backend} (no NVML needed)")
    why = nvml_problem() if backend in ("auto", "nvml") else None
    try:
        found = open_backend(backend, recording)
        samples = found.sample()
    except Exception as exc:  # noqa: BLE001 - a missing driver raises many kinds
        return Check("gpus", FAIL, f"backend {backend}: {type(exc).__name__}: {exc}", NVML_FIX)
    return judge(found.name, len(samples), needed, why)


def judge(backend: str, count: int, needed: int, nvml_why: str | None) -> Check:
    """pass: GPUs seen (as many as asked); warn: none and none asked; fail: fewer than asked."""
    how = f" (NVML: {nvml_why})" if nvml_why and backend != "nvml" else ""
    if count and count >= needed:
        return Check("gpus", PASS, f"{count} GPU(s) through {backend}{how}")
    if not count and not needed:
        smi = "" if shutil.which("nvidia-smi") else "; nvidia-smi not on PATH"
        return Check(
            "gpus",
            WARN,
            f"none{how}{smi}",
            f"only if the job uses GPUs (cluster.n_gpus_per_node): {NVML_FIX}",
        )
    return Check(
        "gpus",
        FAIL,
        f"{count} GPU(s) through {backend}{how}, the config asks for "
        f"{needed} (cluster.n_gpus_per_node)",
        NVML_FIX,
    )


def nvml_problem() -> str | None:
    """Why NVML cannot be used here, in a few words (None: it can)."""
    try:
        NvmlBackend()
    except ImportError:
        return "pynvml not installed"
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return (str(exc) or type(exc).__name__).splitlines()[0][:120]
    return None
