"""Names shared by the launcher, the sidecar and the recorder: trajectory dump files, their
manifests, the environment that turns dumping and replay on, and the config hash.

Kept free of torch so the launcher and the sidecar start fast.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
ENV_DIR = "AREAL_WATCHDOG_TRAJECTORY_DIR"
ENV_MAX_KEEP = "AREAL_WATCHDOG_TRAJECTORY_MAX_KEEP"
ENV_PIN_STEPS = "AREAL_WATCHDOG_TRAJECTORY_PIN_STEPS"
ENV_DUMP_STEPS = "AREAL_WATCHDOG_TRAJECTORY_DUMP_STEPS"
ENV_CONFIG_HASH = "AREAL_WATCHDOG_CONFIG_HASH"
ENV_REPLAY_DIR = "AREAL_WATCHDOG_REPLAY_DIR"
ENV_REPLAY_STEPS = "AREAL_WATCHDOG_REPLAY_STEPS"
ENV_REPLAY_SOURCE = "AREAL_WATCHDOG_REPLAY_SOURCE_RUN"
ENV_REPLAY_UNSAFE = "AREAL_WATCHDOG_REPLAY_UNSAFE_LOAD"
ENV_REPLAY_VERIFIED = "AREAL_WATCHDOG_REPLAY_VERIFIED"  # checksums already checked by the CLI
ENV_REPLAY_GROUPS = "AREAL_WATCHDOG_REPLAY_GROUPS"  # only these groups of the global batch
ENV_REPLAY_PAD_STEP = "AREAL_WATCHDOG_REPLAY_PAD_STEP"  # a step whose groups pad the few chosen
ENV_REPLAY_PAD_TO = "AREAL_WATCHDOG_REPLAY_PAD_TO"  # to a multiple of this (the DP size)
ENV_REPLAY_GROUPS_OF = "AREAL_WATCHDOG_REPLAY_GROUPS_OF"  # the groups come from this step
_FILE = re.compile(r"^step_(?P<step>\d{6,})(?:_dp_(?P<dp>\d+))?\.pt$")


class DumpError(Exception):
    """A dump cannot be used: missing, truncated, corrupted or from another config."""


def step_file_name(step: int, dp_rank: int | None) -> str:
    """``step_000003.pt`` or ``step_000003_dp_1.pt``."""
    return f"step_{step:06d}.pt" if dp_rank is None else f"step_{step:06d}_dp_{dp_rank}.pt"


def manifest_path(data_file: Path) -> Path:
    return data_file.with_name(data_file.name[: -len(".pt")] + ".manifest.json")


def list_step_files(directory: Path) -> list[tuple[int, int | None, Path]]:
    """Every data file in a dump directory: (step, dp rank or None, path)."""
    found = []
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        match = _FILE.match(name)
        if match:
            dp = match["dp"]
            found.append((int(match["step"]), None if dp is None else int(dp), directory / name))
    return sorted(found, key=lambda item: (item[0], -1 if item[1] is None else item[1]))


def complete_steps(directory: Path) -> dict[int, list[Path]]:
    """Steps whose files all have their manifest (written last) and whose data-parallel files
    are all there; files without any manifest (AReaL's own dumps) count as complete."""
    steps: dict[int, list[Path]] = {}
    for step, _dp, path in list_step_files(directory):
        steps.setdefault(step, []).append(path)
    complete = {}
    for step, files in steps.items():
        manifests = [read_manifest(f) for f in files]
        if all(m is None for m in manifests):
            complete[step] = files  # written by AReaL itself
            continue
        if any(m is None for m in manifests):
            continue
        sharded = any(m.get("dp_rank") is not None for m in manifests)
        expected = max(int(m.get("dp_size") or 1) for m in manifests) if sharded else 1
        if len(files) >= expected:
            complete[step] = files
    return complete


NESTED_VOLATILE = frozenset({"trial_name"})  # AReaL repeats it in every engine's section


def _without(value: Any, keys: frozenset[str]) -> Any:
    if isinstance(value, dict):
        return {k: _without(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [_without(v, keys) for v in value]
    return value


def config_hash(tree: dict[str, Any]) -> str:
    """A hash of what shapes the data: the config minus names, paths and our own sections."""
    volatile = {
        "trial_name",
        "cluster",
        "launch",
        "watchdog",
        "trajectory_debug",
        "saver",
        "recover",
        "stats_logger",
        "evaluator",
        "total_train_steps",
    }
    stable = _without({k: v for k, v in tree.items() if k not in volatile}, NESTED_VOLATILE)
    return hashlib.sha256(json.dumps(stable, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_manifest(data_file: Path) -> dict[str, Any] | None:
    """The manifest beside a data file, or None when it is missing, unreadable or not a
    manifest at all (a tampered file: a list, a string, a bad ``dp_size``)."""
    try:
        manifest = json.loads(manifest_path(data_file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict):
        return None
    dp_size = manifest.get("dp_size", 1)
    if dp_size is not None and (isinstance(dp_size, bool) or not isinstance(dp_size, int)):
        return None
    if isinstance(dp_size, int) and not 1 <= dp_size <= 1 << 20:
        return None
    return manifest


def step_problems(directory: Path, step: int) -> list[str]:
    """Why a dumped step is not complete, naming each file (empty when it is not dumped)."""
    files = [p for s, _dp, p in list_step_files(directory) if s == step]
    problems = [
        f"{manifest_path(p)}: missing, unreadable or not a manifest"
        for p in files
        if read_manifest(p) is None
    ]
    manifests = [m for p in files if (m := read_manifest(p)) is not None]
    expected = max((int(m.get("dp_size") or 1) for m in manifests), default=1)
    if files and not problems and len(files) < expected:
        problems.append(f"{directory}: step {step} has {len(files)} of {expected} DP files")
    return problems


def check_file(
    data_file: Path, checksum: bool = True, manifest: dict[str, Any] | None = None
) -> str | None:
    """What is wrong with a dump file (missing, truncated, checksum), or None when it is intact."""
    if not data_file.exists():
        return f"{data_file}: missing"
    manifest = manifest or read_manifest(data_file)
    if manifest is None:
        return (
            f"{manifest_path(data_file)}: missing, unreadable or not a manifest "
            "(an incomplete write or a tampered file?)"
        )
    size = data_file.stat().st_size
    if size != manifest.get("bytes"):
        return f"{data_file}: truncated ({size} bytes, the manifest says {manifest.get('bytes')})"
    if not checksum:
        return None
    digest = hashlib.sha256()
    with open(data_file, "rb") as fh:
        for chunk in iter(lambda: fh.read(8 * 2**20), b""):
            digest.update(chunk)
    if digest.hexdigest() != manifest.get("sha256"):
        return f"{data_file}: checksum mismatch (the file changed after it was written)"
    return None


def int_list(text: str) -> list[int]:
    """Steps from an environment variable: ``"3,5 7"`` -> ``[3, 5, 7]``."""
    return [int(x) for x in text.replace(",", " ").split()]
