"""What a case's run needs beside it, set up for one run and taken down after it: a FUSE mount
that stops answering (``testkit/fuse_storage.py``), an AReaL job's tiny model and dataset
(``examples/areal/harness/make_tiny.py``, made once per set of arguments); and why this machine
cannot run a case (no Slurm cluster, no FUSE, no AReaL)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from benchmarks.hangbench import runs
from benchmarks.hangbench.cases import REPO, Case
from testkit import fuse_storage

MAKE_TINY = REPO / "examples" / "areal" / "harness" / "make_tiny.py"


@contextlib.contextmanager
def beside(case: Case, folder: Path, shared: Path) -> Iterator[str]:
    """The run's storage and AReaL harness (under ``folder``, the run's ``cluster.fileroot``;
    the harness made once under ``shared``, the benchmark's temporary folder); yields the
    storage's mountpoint ('' for none)."""
    if "areal" in case.needs:  # every AReaL job: its model and data (``areal_harness``'s flags)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "harness").symlink_to(areal_harness(case.areal_harness, shared))
    if not case.storage:
        yield ""
        return
    world = int((case.config.get("launch") or {}).get("nproc_per_node", 1))
    mountpoint = folder / "storage"
    storage = fuse_storage.FuseStorage(mountpoint, ranks=world, size_mb=32, **case.storage)
    try:
        yield str(mountpoint)
    finally:
        storage.close()


def areal_harness(args: tuple[str, ...], shared: Path) -> Path:
    """The tiny model, tokenizer and GSM8K rows ``make_tiny.py`` makes offline with ``args``,
    made once per benchmark (under ``shared``) and set of arguments."""
    key = hashlib.sha256(" ".join(args).encode()).hexdigest()[:12]
    root = shared / f"areal-harness-{key}"
    if not root.is_dir():
        subprocess.run([sys.executable, str(MAKE_TINY), str(root), *args], check=True,
                       capture_output=True, timeout=600)  # fmt: skip
    return root


def missing(case: Case) -> str:
    """Why this machine cannot run the case ('' when it can)."""
    if "slurm" in case.needs and not _slurm_up():
        return "needs a Slurm cluster: bash scripts/slurm-cluster.sh up"
    if "fuse" in case.needs and (why := fuse_storage.available()):
        return f"needs a FUSE mount: {why}"
    if "areal" in case.needs:
        if importlib.util.find_spec("areal") is None:
            return "needs AReaL: bash scripts/setup.sh --areal"
        if os.geteuid() != 0 or not shutil.which("unshare"):
            return "needs root and unshare (a loopback-only network namespace for AReaL)"
    return ""


@functools.cache
def _slurm_up() -> bool:
    """Whether a Slurm cluster answers with idle nodes (``SLURM_CONF``, else the one
    scripts/slurm-cluster.sh brings up)."""
    env = {**os.environ}
    env.setdefault("SLURM_CONF", str(runs.SLURM_CONF))
    if not shutil.which("sinfo") or not Path(env["SLURM_CONF"]).is_file():
        return False
    out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True,
                         check=False, timeout=60)  # fmt: skip
    return out.returncode == 0 and "idle" in out.stdout.split()
