"""Is the run directory's filesystem one the watchdog can use? Its kind (``/proc/mounts``:
local, NFS, FUSE), FIFOs (the ranks' Flight Recorder and asyncio-task listeners wait on them)
and atomic renames (every record is written through one), tried for real in a temporary folder
under the fileroot, removed afterwards. On Slurm the folder is the launcher's: a node that
cannot see it does not share the run directory."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from areal_watchdog.common.atomic import write_text_atomic
from areal_watchdog.common.interprocess.fifo import write_fifo
from areal_watchdog.doctor.model import FAIL, PASS, WARN, Check

NETWORK = ("lustre", "gpfs", "ceph", "beegfs", "glusterfs", "cifs", "smb3", "9p", "wekafs")
FIFO_FIX = (
    "put cluster.fileroot on a filesystem with FIFOs (local disk or NFS); without them the "
    "Flight Recorder and asyncio-task listeners are off"
)
RENAME_FIX = "put cluster.fileroot on a local disk or NFS: every record is written by a rename"
_OCTAL = re.compile(r"\\([0-7]{3})")


def parse_mounts(text: str) -> list[tuple[str, str]]:
    """``(mount point, filesystem type)`` of each ``/proc/mounts`` line."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            mounts.append((_OCTAL.sub(lambda m: chr(int(m[1], 8)), fields[1]), fields[2]))
    return mounts


def mount_type(path: str, mounts: list[tuple[str, str]]) -> tuple[str, str]:
    """The mount point holding ``path`` (a resolved path) and its type: the longest match."""
    best = ("/", "unknown")
    for point, kind in mounts:
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, kind)
    return best


def kind_of(fstype: str) -> str:
    """``NFS``, ``FUSE``, ``network`` or ``local``."""
    if fstype.startswith("nfs"):
        return "NFS"
    if fstype.startswith("fuse"):
        return "FUSE"
    return "network" if fstype in NETWORK else "local"


def existing_ancestor(path: str) -> Path:
    """``path`` or the nearest folder above it that exists (a fileroot not made yet)."""
    here = Path(path).expanduser().absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    return here


def filesystem_check(where: Path, mounts_text: str, asked: str = "") -> Check:
    point, fstype = mount_type(str(where.resolve()), parse_mounts(mounts_text))
    kind = kind_of(fstype)
    label = f"{asked} (not made yet: {where})" if asked and Path(asked) != where else str(where)
    detail = f"{label}: {kind} ({fstype} on {point})"
    if kind == "FUSE":
        return Check(
            "run dir filesystem",
            WARN,
            detail + "; FIFOs and renames tried below",
            "prefer a local disk or NFS for cluster.fileroot",
        )
    return Check("run dir filesystem", PASS, detail)


def check_filesystem(probe_dir: str, shared_dir: str | None = None) -> list[Check]:
    """The filesystem's kind, then FIFOs and atomic renames tried in a temporary folder."""
    if shared_dir is not None and not os.path.isdir(shared_dir):
        return [
            Check(
                "run dir filesystem",
                FAIL,
                f"{shared_dir}, made by the launcher, is not "
                "visible here: the fileroot is not shared between the nodes",
                "put cluster.fileroot on a filesystem every node mounts",
            )
        ]
    where = Path(shared_dir) if shared_dir else existing_ancestor(probe_dir)
    try:
        mounts_text = Path("/proc/mounts").read_text()
    except OSError:
        mounts_text = ""
    checks = [filesystem_check(where, mounts_text, shared_dir or probe_dir)]
    try:
        tmp = Path(tempfile.mkdtemp(prefix=".areal-doctor-", dir=where))
    except OSError as exc:
        return [
            *checks,
            Check(
                "fifos",
                FAIL,
                f"cannot write in {where}: {exc.strerror}",
                f"make {where} writable by you, or change cluster.fileroot",
            ),
        ]
    try:
        return [*checks, fifo_check(tmp), rename_check(tmp)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fifo_check(tmp: Path) -> Check:
    """A FIFO made, woken by the writer the sidecar uses, and read back."""
    path = tmp / "trigger"
    try:
        os.mkfifo(path, 0o600)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return Check("fifos", FAIL, f"mkfifo in {tmp.parent}: {exc.strerror}", FIFO_FIX)
    try:
        sent = write_fifo(path, "ping")
        got = os.read(fd, 64) if sent else b""
    finally:
        os.close(fd)
    if got != b"ping\n":
        return Check("fifos", FAIL, f"a FIFO in {tmp.parent} does not carry a write", FIFO_FIX)
    return Check("fifos", PASS, f"a FIFO in {tmp.parent} carries a write")


def rename_check(tmp: Path) -> Check:
    """A file replaced through a rename reads as the new one, with no temporary left."""
    target = tmp / "record.json"
    try:
        write_text_atomic(target, "old")
        write_text_atomic(target, "new")
        left = [p.name for p in tmp.iterdir() if p.name.endswith(".tmp")]
        ok = target.read_text() == "new" and not left
    except OSError as exc:
        return Check("atomic rename", FAIL, f"in {tmp.parent}: {exc.strerror}", RENAME_FIX)
    if not ok:
        return Check("atomic rename", FAIL, f"in {tmp.parent}: the old file stayed", RENAME_FIX)
    return Check("atomic rename", PASS, f"a file in {tmp.parent} replaced by a rename")
