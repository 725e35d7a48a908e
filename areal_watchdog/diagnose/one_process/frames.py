"""Whose code a stack frame is, and how to show its file so that nobody mistakes it.

A frame is the user's own code unless it lives in an installed package (``site-packages``,
``dist-packages``, the standard library) or in AReaL itself, wherever AReaL was installed from:
AReaL's README installs it from a clone (``uv sync``), so its files need not sit in
``site-packages``. AReaL's files are recognised by its package layout (``areal/<one of its
subpackages>/...``), so a user's own ``areal/my_workflow.py`` stays the user's.
"""

from __future__ import annotations

import os
import re

from areal_watchdog.evidence.model import Frame

_INSTALLED = re.compile(r"(?:site|dist)-packages/|/lib/python3\.\d+/")
AREAL_SUBPACKAGES = (
    "api", "controller", "dataset", "engine", "experimental", "infra", "models", "platforms",
    "reward", "scheduler", "thirdparty", "tools", "trainer", "utils", "workflow",
)  # fmt: skip
_AREAL_FILE = re.compile(rf"/areal/(?:{'|'.join(AREAL_SUBPACKAGES)})/|/areal/__init__\.py$")


def is_library(frame: Frame) -> bool:
    """True for an installed package's frame, the standard library's, AReaL's and ``<...>``."""
    return is_library_path(frame.filename)


def is_library_path(path: str) -> bool:
    """A relative path is compiled code's (``uvloop/loop.pyx``), never the user's script."""
    if path.startswith("<") or not path.startswith("/"):
        return True
    return bool(_INSTALLED.search(path) or _AREAL_FILE.search(path))


# torch.distributed's package (c10d, functional collectives, FSDP, DTensor, pipelining, elastic
# rendezvous) and c10d's compiled bindings: the only files whose `send`, `broadcast` or
# `barrier` is a distributed operation; requests', zmq's, asyncio's or the user's are not.
_DISTRIBUTED_FILES = ("torch/distributed/", "torch/_C/_distributed", "c10d")


def is_distributed(frame: Frame) -> bool:
    """A frame of torch.distributed (or of c10d, over NCCL or gloo), judged by its file."""
    return any(marker in frame.filename for marker in _DISTRIBUTED_FILES)


def is_areal(path: str) -> bool:
    """A file of AReaL's own package, installed or in a clone."""
    return bool(_AREAL_FILE.search(path))


def bare(name: str) -> str:
    """``Trainer.__exit__`` -> ``__exit__``."""
    return name.rsplit(".", 1)[-1]


def display_path(path: str, cwd: str | None = None) -> str:
    """A file as people read it in a summary: an installed package's file as
    ``site-packages/areal/...``, the user's own relative to the process's working directory
    when it lies below it, else in full (never cut to two parts: ``areal/my_workflow.py`` of
    the user's must not read as AReaL's)."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return marker + path.split(marker, 1)[1]
    if cwd and path.startswith(cwd.rstrip("/") + "/"):
        return os.path.relpath(path, cwd)
    return path
