"""Shared storage whose server stops answering, for real: a FUSE filesystem (Debian's
``libfuse2`` through ``fusepy``) serving read-only ``shard-<rank>.bin`` files. A read at or past
``--freeze-at-mb`` waits, as a read from a dead NFS or Lustre server does (the reader sits in
``read()`` in the kernel, state ``D``, wait channel ``request_wait_answer``) until the server
gets SIGUSR1 (or, with ``--thaw-after S``, S seconds after the first read waited: a server
that fails over): then every waiting read is answered and the storage serves again.

``python testkit/fuse_storage.py MOUNTPOINT --ranks 4 --size-mb 16 --freeze-at-mb 4`` (root:
``/dev/fuse``); ``FuseStorage`` mounts it for a test and takes it down again.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

MB = 1 << 20


def available() -> str | None:
    """Why no FUSE filesystem can be mounted here; None when one can."""
    if os.geteuid() != 0:
        return "mounting a FUSE filesystem needs root here"
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse on this machine"
    try:
        import fuse  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"no fusepy with libfuse2 ({exc}): apt-get install libfuse2; pip install fusepy"
    return None


def serve(mountpoint: str, ranks: int, size_mb: int, freeze_at_mb: int, thaw_after: float) -> None:
    from fuse import FUSE, FuseOSError, Operations

    thawed, frozen = threading.Event(), threading.Lock()
    signal.signal(signal.SIGUSR1, lambda *_: thawed.set())
    names = {f"/shard-{r}.bin" for r in range(ranks)}
    size = size_mb * MB
    now = time.time()

    class Shards(Operations):
        def getattr(self, path: str, fh: object = None) -> dict:
            if path == "/":
                return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2, "st_mtime": now}
            if path in names:
                return {"st_mode": stat.S_IFREG | 0o444, "st_nlink": 1, "st_size": size,
                        "st_mtime": now}  # fmt: skip
            raise FuseOSError(errno.ENOENT)

        def readdir(self, path: str, fh: object) -> list[str]:
            return [".", "..", *(n.lstrip("/") for n in sorted(names))]

        def read(self, path: str, length: int, offset: int, fh: object) -> bytes:
            if path not in names:
                raise FuseOSError(errno.ENOENT)
            if offset >= freeze_at_mb * MB:
                if thaw_after and frozen.acquire(blocking=False):  # the first read to wait
                    threading.Timer(thaw_after, thawed.set).start()
                thawed.wait()  # the server stopped answering
            return b"\x5a" * min(length, max(0, size - offset))

    # direct_io: every read reaches the server (no page cache, no readahead), as on NFS with
    # a cold cache; the reader then waits in request_wait_answer
    FUSE(Shards(), mountpoint, foreground=True, nothreads=False, ro=True, direct_io=True)


class FuseStorage:
    """The filesystem mounted at ``mountpoint`` for a test: ``thaw`` makes it answer again,
    ``close`` thaws, unmounts and ends its server."""

    def __init__(
        self, mountpoint: Path, ranks: int, size_mb: int, freeze_at_mb: int, thaw_after: float = 0
    ) -> None:
        self.mountpoint = mountpoint
        mountpoint.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, __file__, str(mountpoint), "--ranks", str(ranks),
                "--size-mb", str(size_mb), "--freeze-at-mb", str(freeze_at_mb),
                "--thaw-after", str(thaw_after)]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not os.path.ismount(mountpoint):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the FUSE filesystem did not mount at {mountpoint}")
            time.sleep(0.1)

    def thaw(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGUSR1)

    def close(self) -> None:
        self.thaw()
        time.sleep(0.2)
        subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mountpoint")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--size-mb", type=int, default=16)
    parser.add_argument("--freeze-at-mb", type=int, default=4)
    parser.add_argument("--thaw-after", type=float, default=0.0, help="0: only on SIGUSR1")
    args = parser.parse_args()
    serve(args.mountpoint, args.ranks, args.size_mb, args.freeze_at_mb, args.thaw_after)
