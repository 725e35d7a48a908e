"""What the kernel says a blocked process waits on: its state (``D``: uninterruptible, in the
kernel), its wait channel, the system call it is in, the file that call is on, and that file's
mount and filesystem type.

A rank blocked on storage that stopped answering (a dead NFS, Lustre or FUSE server) sits in
``read()`` in state ``D`` with no CPU and no bytes moving; its Python stack shows only the read.
Everything here comes from ``/proc`` (``stat``, ``wchan``, ``syscall``, ``fd/N``, ``mem`` for a
path argument, ``mountinfo``): the kernel's own records, never the file or the mount itself. A
``stat`` or ``open`` of the path would block the sidecar on the dead mount as it blocked the
rank, so nothing here ever touches it.
"""

from __future__ import annotations

import contextlib
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# x86-64 system call numbers of the calls a watchdog names (elsewhere the number is shown).
SYSCALLS_X86_64 = {
    0: "read", 1: "write", 2: "open", 3: "close", 4: "stat", 5: "fstat", 6: "lstat", 7: "poll",
    16: "ioctl", 17: "pread64", 18: "pwrite64", 19: "readv", 20: "writev", 21: "access",
    23: "select", 35: "nanosleep", 40: "sendfile", 42: "connect", 43: "accept", 44: "sendto",
    45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 61: "wait4", 74: "fsync", 75: "fdatasync",
    76: "truncate", 77: "ftruncate", 78: "getdents", 82: "rename", 83: "mkdir", 87: "unlink",
    202: "futex", 217: "getdents64", 219: "restart_syscall", 230: "clock_nanosleep",
    232: "epoll_wait",
    247: "waitid", 257: "openat", 262: "newfstatat", 270: "pselect6", 271: "ppoll",
    281: "epoll_pwait", 285: "fallocate", 295: "preadv", 296: "pwritev", 326: "copy_file_range",
    332: "statx",
}  # fmt: skip
# Calls on a file descriptor (its first argument) and on a path (the argument's index).
FD_CALLS = frozenset({"read", "write", "pread64", "pwrite64", "readv", "writev", "fstat",
                      "fsync", "fdatasync", "ftruncate", "getdents", "getdents64", "fallocate",
                      "preadv", "pwritev", "sendfile", "copy_file_range"})  # fmt: skip
PATH_ARG = {"open": 0, "stat": 0, "lstat": 0, "access": 0, "truncate": 0, "mkdir": 0,
            "unlink": 0, "rename": 0, "openat": 1, "newfstatat": 1, "statx": 1}  # fmt: skip
STORAGE_CALLS = FD_CALLS | frozenset(PATH_ARG)  # calls that wait on a filesystem
NOT_STORAGE = ("/dev/", "/proc/", "/sys/")  # files whose reads wait on no storage (a terminal)
WAIT_CALLS = frozenset({"wait4", "waitid"})  # a process waiting for a child to end
PATH_MAX = 4096


@dataclass(frozen=True)
class KernelWait:
    """One thread's wait as the kernel has it; the file fields only for a call on a file."""

    tid: int
    state: str  # R running, S sleeping, D uninterruptible (in the kernel), T stopped, ...
    wchan: str = ""  # the kernel function it sleeps in (``request_wait_answer``: FUSE)
    syscall: str = ""  # ``read``, ``futex``, ``syscall 999``; "" when not in one
    path: str = ""  # the file the call is on
    mount: str = ""  # that file's mount point
    fstype: str = ""  # and its filesystem type (``fuse.sshfs``, ``nfs4``, ``lustre``)
    source: str = ""  # the mount's source (``server:/export``)
    waits_for: int = 0  # wait4/waitid: the child pid it waits for (0: any, or no such call)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KernelWait:
        """From a report's entry (a hand-edited one gives empty fields, never an error)."""
        tid = data.get("tid")
        text = {k: str(data.get(k) or "") for k in ("state", "wchan", "syscall", "path",
                                                     "mount", "fstype", "source")}  # fmt: skip
        child = data.get("waits_for")
        return cls(tid if isinstance(tid, int) else 0, **text,
                   waits_for=child if isinstance(child, int) else 0)  # fmt: skip

    @property
    def on_storage(self) -> bool:
        """In a call that waits on a filesystem, on a file whose mount is known."""
        return self.on_a_file and bool(self.mount)

    @property
    def on_a_file(self) -> bool:
        """In a filesystem call on a file (not a pipe, a socket, a terminal or /proc)."""
        return (
            self.syscall in STORAGE_CALLS
            and self.path.startswith("/")
            and not any(self.path.startswith(top) for top in NOT_STORAGE)
        )

    @property
    def stuck(self) -> bool:
        """Blocked in the kernel (D), or asleep in a filesystem call on a file: a FUSE
        server's reader sleeps interruptibly in ``request_wait_answer``, an NFS one in D."""
        return self.state == "D" or (self.state == "S" and self.on_a_file)

    def phrase(self) -> str:
        """``D (uninterruptible) in read() on /mnt/data/shard-0.bin (fuse, /mnt/data)``."""
        state = {"D": "D (uninterruptible)", "S": "S (sleeping)", "R": "R (running)",
                 "T": "T (stopped)"}.get(self.state, self.state)  # fmt: skip
        call = f" in {self.syscall}()" if self.syscall else ""
        where = f" on {self.path}" if self.path else ""
        mount = f" ({self.fstype}, mounted at {self.mount})" if self.mount else ""
        chan = f", wait channel {self.wchan}" if self.wchan and self.wchan != "0" else ""
        return f"{state}{call}{where}{mount}{chan}"


def kernel_waits(pid: int) -> list[KernelWait]:
    """The process's main thread's wait, then every other thread in ``D`` state."""
    found = []
    for tid in _tids(pid):
        state = _state(f"/proc/{pid}/task/{tid}/stat")
        if state is None or (tid != pid and state != "D"):
            continue
        found.append(_wait(pid, tid, state))
    return sorted(found, key=lambda w: w.tid != pid)


def main_wait(pid: int, with_mount: bool = False) -> KernelWait | None:
    """The main thread's wait, cheaply (its mount only ``with_mount``): what a poll reads of a
    rank that burns no CPU; None when the process is gone."""
    state = _state(f"/proc/{pid}/task/{pid}/stat")
    if state is None:
        return None
    if state not in ("D", "S"):
        return KernelWait(pid, state)
    return _wait(pid, pid, state, with_mount)


def _wait(pid: int, tid: int, state: str, with_mount: bool = True) -> KernelWait:
    base = f"/proc/{pid}/task/{tid}"
    wchan = _read(f"{base}/wchan").strip()
    call, args = _syscall(_read(f"{base}/syscall"))
    path = ""
    if call in FD_CALLS and args:
        path = _fd_path(pid, args[0])
    elif call in PATH_ARG and len(args) > PATH_ARG[call]:
        path = _string_at(pid, args[PATH_ARG[call]])
        if path and not path.startswith("/"):
            path = os.path.join(_link(f"/proc/{pid}/cwd"), path)
    mount = mount_of(pid, path) if with_mount and path.startswith("/") else ("", "", "")
    child = _waited_child(call, args)
    return KernelWait(tid, state, wchan, call, path, *mount, waits_for=child)


def _waited_child(call: str, args: list[int]) -> int:
    """The pid a wait4 (its first argument) or a waitid on one pid (P_PID, 1) names."""
    if call == "wait4" and args and 0 < args[0] < 1 << 22:
        return args[0]
    if call == "waitid" and len(args) > 1 and args[0] == 1:
        return args[1]
    return 0


def _syscall(text: str) -> tuple[str, list[int]]:
    """``/proc/.../syscall``: the call's number and arguments (``running`` or ``-1``: none)."""
    parts = text.split()
    if not parts or not parts[0].lstrip("-").isdigit() or int(parts[0]) < 0:
        return "", []
    number = int(parts[0])
    names = SYSCALLS_X86_64 if platform.machine() == "x86_64" else {}
    args = []
    for value in parts[1:7]:
        with contextlib.suppress(ValueError):
            args.append(int(value, 16))
    return names.get(number, f"syscall {number}"), args


def _fd_path(pid: int, fd: int) -> str:
    return _link(f"/proc/{pid}/fd/{fd}") if 0 <= fd < 1 << 20 else ""


def _string_at(pid: int, address: int) -> str:
    """The NUL-terminated string at ``address`` in the process (a path argument), read from
    its memory: never from the filesystem it names."""
    with (
        contextlib.suppress(OSError, ValueError, OverflowError),
        open(f"/proc/{pid}/mem", "rb", buffering=0) as mem,
    ):
        mem.seek(address)
        return mem.read(PATH_MAX).split(b"\0", 1)[0].decode(errors="replace")
    return ""


def mount_of(pid: int, path: str) -> tuple[str, str, str]:
    """(mount point, filesystem type, source) of the mount ``path`` is on, as the process sees
    its mounts (``/proc/PID/mountinfo``: the longest mount point above the path)."""
    best = ("", "", "")
    for line in _read(f"/proc/{pid}/mountinfo").splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if len(fields) < dash + 3 or len(fields) < 5:
            continue
        point = _unescape(fields[4])
        if _under(path, point) and len(point) > len(best[0]):
            best = (point, fields[dash + 1], _unescape(fields[dash + 2]))
    return best


def _under(path: str, point: str) -> bool:
    return point == "/" or path == point or path.startswith(point.rstrip("/") + "/")


def _unescape(text: str) -> str:
    """mountinfo's octal escapes (``\\040`` for a space)."""
    with contextlib.suppress(UnicodeDecodeError):
        return text.encode().decode("unicode_escape")
    return text


def _tids(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit())
    return []


def _state(stat_path: str) -> str | None:
    text = _read(stat_path)
    tail = text.rsplit(")", 1)[-1].split()
    return tail[0] if tail else None


def _read(path: str) -> str:
    with contextlib.suppress(OSError):
        return Path(path).read_text(errors="replace")
    return ""


def _link(path: str) -> str:
    with contextlib.suppress(OSError):
        return os.readlink(path)
    return ""
