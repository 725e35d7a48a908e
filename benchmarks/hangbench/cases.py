"""A HangBench case: a folder holding ``case.yaml`` (a program, its settings and a label), read
and checked here so that a case with a missing or mistyped key fails in one line naming the file
and the key, before anything runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CASES = Path(__file__).resolve().parent / "cases"
NEEDS = {"vllm", "slurm", "fuse", "areal"}  # what a case may need beyond torch and gloo


class CaseError(ValueError):
    """A case.yaml the runner cannot read: the message names the file, the key and the fix."""


@dataclass(frozen=True)
class Label:
    """The truth a tool is scored against."""

    healthy: bool
    kind: str = ""  # a category or cause of diagnose/kinds.py
    culprit_ranks: tuple[int, ...] = ()
    after_step: int = 0  # the last good step: the hang starts at its line (0: at launch)
    culprit_server: bool = False  # the culprit is the job's inference server (its address)
    racing_step: int = 0  # a step after the hang that prints or not as a race goes (0: none)


@dataclass(frozen=True)
class Case:
    """One labelled program: ``config`` is the launch config (``base`` merged with the case's
    ``config``), ``program`` the script every rank runs."""

    name: str
    folder: Path
    title: str
    program: Path
    config: dict[str, Any]
    label: Label
    needs: tuple[str, ...] = field(default=())
    limit: float = 25.0  # seconds a tool has from the hang (the collective timeout is set to it)
    quick: bool = False  # one of the chosen third that ``--quick`` runs
    storage: dict[str, Any] = field(default_factory=dict)  # a FUSE mount at {storage_dir}
    areal_harness: tuple[str, ...] = ()  # make_tiny.py's arguments: the AReaL job's model, data

    @property
    def torchrun_ranks(self) -> bool:
        """Whether torchrun starts the ranks (so the harness, a timeout or a heartbeat reaches
        them): not in AReaL's single-controller mode, where its scheduler starts its workers."""
        return (self.config.get("launch") or {}).get("mode") != "single_controller"

    @property
    def trial(self) -> str:
        """The run's trial name (AReaL allows no '-' in it)."""
        return self.name.replace("-", "_")


def load_cases(folder: Path = CASES) -> list[Case]:
    """Every case under ``folder``, sorted by name."""
    return [load_case(path.parent) for path in sorted(folder.glob("*/case.yaml"))]


def load_case(folder: Path) -> Case:
    path = folder / "case.yaml"
    raw = _mapping(yaml.safe_load(path.read_text()), path, "the file")
    base = _resolve(folder, _required(raw, "base", str, path))
    if not base.is_file():
        raise CaseError(f"{path}: base: {base} does not exist; name a launch config")
    config = yaml.safe_load(base.read_text())
    config.pop("watchdog", None)  # the tools set the watchdog; a case only its hardware stand-ins
    config = _merge(config, _mapping(raw.get("config", {}), path, "config"))
    own = _mapping(raw.get("config", {}), path, "config").get("launch", {}).get("entrypoint")
    entry = own or _mapping(config.get("launch"), path, "launch").get("entrypoint")
    program = (folder if own else base.parent).joinpath(str(entry)).resolve()
    if not program.is_file():
        raise CaseError(f"{path}: launch.entrypoint: {program} does not exist")
    needs = tuple(raw.get("needs", ()))
    if unknown := set(needs) - NEEDS:
        raise CaseError(f"{path}: needs: {sorted(unknown)} unknown; choose from {sorted(NEEDS)}")
    return Case(
        name=folder.name,
        folder=folder,
        title=_required(raw, "title", str, path),
        program=program,
        config=config,
        label=_label(_mapping(raw.get("label"), path, "label"), path),
        needs=needs,
        limit=float(raw.get("limit", 25.0)),
        quick=_optional(raw, "quick", bool, path, False),
        storage=_storage(raw, path),
        areal_harness=tuple(map(str, _optional(raw, "areal_harness", list, path, []))),
    )


def _storage(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """The shared storage the runner mounts for the case (``testkit/fuse_storage.py``): the
    megabyte its reads stop being answered at, and the seconds until it answers again (0:
    never)."""
    storage = _mapping(raw.get("storage", {}), path, "storage")
    if unknown := set(storage) - {"freeze_at_mb", "thaw_after"}:
        raise CaseError(f"{path}: storage: {sorted(unknown)} unknown; use freeze_at_mb, thaw_after")
    if storage and "fuse" not in raw.get("needs", ()):
        raise CaseError(f"{path}: storage needs a FUSE mount; add needs: [fuse]")
    return storage


def _label(raw: dict[str, Any], path: Path) -> Label:
    healthy = _required(raw, "healthy", bool, path, "label.")
    if healthy:
        return Label(healthy=True)
    return Label(
        healthy=False,
        kind=_required(raw, "kind", str, path, "label."),
        culprit_ranks=tuple(_required(raw, "culprit_ranks", list, path, "label.")),
        after_step=_required(raw, "after_step", int, path, "label."),
        culprit_server=_optional(raw, "culprit_server", bool, path, False),
        racing_step=_optional(raw, "racing_step", int, path, 0),
    )


def _required(raw: dict[str, Any], key: str, kind: type, path: Path, prefix: str = "") -> Any:
    if key not in raw:
        raise CaseError(f"{path}: {prefix}{key} is missing; add it ({kind.__name__})")
    if not isinstance(raw[key], kind):
        raise CaseError(f"{path}: {prefix}{key}: {raw[key]!r} is not a {kind.__name__}")
    return raw[key]


def _optional(raw: dict[str, Any], key: str, kind: type, path: Path, default: Any) -> Any:
    if key in raw and not isinstance(raw[key], kind):
        raise CaseError(f"{path}: {key}: {raw[key]!r} is not a {kind.__name__}")
    return raw.get(key, default)


def _mapping(value: object, path: Path, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CaseError(f"{path}: {key} must be a mapping, not {type(value).__name__}")
    return value


def _resolve(folder: Path, name: str) -> Path:
    """``./x`` is the case's own file; anything else is relative to the repository."""
    return (folder / name).resolve() if name.startswith("./") else (REPO / name).resolve()


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        both = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = _merge(merged[key], value) if both else value
    return merged
