"""A run directory that nobody else can plant anything in, checked before it is written or read.

The default fileroot is under ``/tmp`` and the path is predictable, so another local user could
create the run directory first and fill it with symlinks or forged records. The launcher
therefore creates every directory from the fileroot down itself, or accepts one that exists only
when it is a real directory (no symlink), owned by the launching user (or root, for the
directories above the run) and writable by nobody else (a sticky, world-writable directory such
as ``/tmp`` is fine above the run: others cannot rename or remove what is ours there).

Every command that later reads a run directory (``status``, ``cancel``, ``replay``, ``diagnose``,
the spool flush) applies the same rules through ``check_run_dir``: what it reads there decides
what runs (a job id handed to ``scancel``, a message signed with our secret), so it must be a
directory only we could have written.
"""

from __future__ import annotations

import functools
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


@functools.lru_cache(maxsize=16)
def run_dir_owner(run_dir: Path) -> int:
    """The uid of the job's user (the run directory's owner; ours when it cannot be read):
    whose processes and logs count. Looked up once a process: a stat on the shared filesystem
    each time told nothing new."""
    try:
        return run_dir.stat().st_uid
    except OSError:
        return os.geteuid()


def check_run_dir(run_dir: Path) -> Path:
    """The run directory a command is about to read, resolved; UserError naming the first
    directory on the way that another user could have written (run the command as the user
    who launched the run)."""
    fix = "run this command as the user who launched the run"
    try:
        check_ancestors(run_dir, fix)
        resolved = run_dir.resolve(strict=True)
        check_ancestors(resolved.parent, fix)
    except OSError as exc:
        raise UserError(f"{run_dir}: cannot read the run directory: {exc.strerror}") from None
    for directory in (resolved, resolved / "watchdog"):
        if directory.exists() or directory.is_symlink():
            _check_owned(directory, allow_root=False, fix=fix)
    return resolved


def private_dir_problem(path: Path) -> str | None:
    """Why ``path`` is not a directory of ours that nobody else may even read (a spool holds
    messages we sign and send), or None when it is."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return exc.strerror
    if not stat.S_ISDIR(info.st_mode):
        return "not a plain directory (a symlink?)"
    if info.st_uid != os.geteuid():
        return f"owned by uid {info.st_uid}, not by you"
    if info.st_mode & 0o077:
        return f"mode {stat.S_IMODE(info.st_mode):o}, not 700"
    return None


_FILEROOT_FIX = "choose another cluster.fileroot"


def check_ancestors(path: Path, fix: str = _FILEROOT_FIX) -> None:
    """Every existing directory from ``/`` to ``path``: a directory owned by us or root, and if
    others may write to it, sticky (like /tmp)."""
    for directory in [*reversed(path.parents), path]:
        if directory.exists() or directory.is_symlink():
            _check_trusted_ancestor(directory, fix)


def _check_trusted_ancestor(path: Path, fix: str) -> None:
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        resolved = path.resolve()
        if resolved == path:
            raise UserError(f"{path}: a symlink loop; {fix}")
        info = os.stat(path)
        if info.st_uid not in (0, os.geteuid()):
            raise UserError(f"{path}: a symlink owned by uid {info.st_uid}; {fix}")
    if not stat.S_ISDIR(info.st_mode):
        raise UserError(f"{path}: not a directory; {fix}")
    if info.st_uid not in (0, os.geteuid()):
        raise UserError(
            f"{path}: owned by uid {info.st_uid}, not by you or root: another user could change "
            f"what is inside; {fix}"
        )
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        raise UserError(
            f"{path}: writable by others and not sticky: another user could replace the run "
            f"directory; {fix}"
        )


_TRIAL_FIX = "remove it or choose another trial_name"


def _check_owned(path: Path, allow_root: bool, fix: str = _TRIAL_FIX) -> None:
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UserError(
            f"{path}: exists and is not a plain directory (a symlink?): refusing to use it; {fix}"
        )
    owners = (os.geteuid(), 0) if allow_root else (os.geteuid(),)
    if info.st_uid not in owners:
        raise UserError(
            f"{path}: owned by uid {info.st_uid}, not by you: refusing to use it; {fix}"
        )
    if info.st_mode & 0o022:
        raise UserError(
            f"{path}: writable by group or others (mode {stat.S_IMODE(info.st_mode):o}): "
            f"refusing to use it; chmod go-w {path} or {fix}"
        )
