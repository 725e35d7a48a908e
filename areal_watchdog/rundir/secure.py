"""A run directory that nobody else can plant anything in.

The default fileroot is under ``/tmp`` and the path is predictable, so another local user could
create the run directory first and fill it with symlinks or forged records. The launcher
therefore creates every directory from the fileroot down itself, or accepts one that exists only
when it is a real directory (no symlink), owned by the launching user (or root, for the
directories above the run) and writable by nobody else (a sticky, world-writable directory such
as ``/tmp`` is fine above the run: others cannot rename or remove what is ours there).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from areal_watchdog.common.errors import UserError

DEFAULT_MODE = 0o700


def ensure_run_dir(run_dir: Path, fileroot: Path, mode: int = DEFAULT_MODE) -> None:
    """Create (or check) ``fileroot`` -> ``run_dir`` -> ``run_dir/watchdog``; raise UserError
    naming the first unsafe directory."""
    check_ancestors(fileroot)
    try:
        fileroot.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{fileroot}: cannot create the fileroot: {exc.strerror}") from None
    check_ancestors(fileroot)  # again: nothing may have been slipped in meanwhile
    between = run_dir.relative_to(fileroot).parents
    for directory in [fileroot / d for d in reversed(between) if d != Path(".")]:
        ensure_private_dir(directory, 0o755)
    ensure_private_dir(run_dir, mode)
    ensure_private_dir(run_dir / "watchdog", mode)


def ensure_private_dir(path: Path, mode: int) -> None:
    """``path`` exists as a real directory of ours that others may not write to."""
    try:
        os.mkdir(path, mode)
        os.chmod(path, mode)  # mkdir's mode is masked by the umask
        return
    except FileExistsError:
        pass
    except OSError as exc:
        raise UserError(f"{path}: cannot create the directory: {exc.strerror}") from None
    _check_owned(path, allow_root=False)


def check_ancestors(path: Path) -> None:
    """Every existing directory from ``/`` to ``path``: a directory owned by us or root, and if
    others may write to it, sticky (like /tmp)."""
    for directory in [*reversed(path.parents), path]:
        if directory.exists() or directory.is_symlink():
            _check_trusted_ancestor(directory)


def _check_trusted_ancestor(path: Path) -> None:
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        resolved = path.resolve()
        if resolved == path:
            raise UserError(f"{path}: a symlink loop; choose another cluster.fileroot")
        info = os.stat(path)
        if info.st_uid not in (0, os.geteuid()):
            raise UserError(
                f"{path}: a symlink owned by uid {info.st_uid}; choose another cluster.fileroot"
            )
    if not stat.S_ISDIR(info.st_mode):
        raise UserError(f"{path}: not a directory; choose another cluster.fileroot")
    if info.st_uid not in (0, os.geteuid()):
        raise UserError(
            f"{path}: owned by uid {info.st_uid}, not by you or root: another user could change "
            "what is inside; choose another cluster.fileroot"
        )
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        raise UserError(
            f"{path}: writable by others and not sticky: another user could replace the run "
            "directory; fix its permissions or choose another cluster.fileroot"
        )


def _check_owned(path: Path, allow_root: bool) -> None:
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UserError(
            f"{path}: exists and is not a plain directory (a symlink?): refusing to use it; "
            "remove it or choose another trial_name"
        )
    owners = (os.geteuid(), 0) if allow_root else (os.geteuid(),)
    if info.st_uid not in owners:
        raise UserError(
            f"{path}: owned by uid {info.st_uid}, not by you: refusing to use it; remove it or "
            "choose another trial_name"
        )
    if info.st_mode & 0o022:
        raise UserError(
            f"{path}: writable by group or others (mode {stat.S_IMODE(info.st_mode):o}): "
            f"refusing to use it; chmod go-w {path} or choose another trial_name"
        )
