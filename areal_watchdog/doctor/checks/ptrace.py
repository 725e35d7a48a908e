"""Can the sidecar take py-spy stacks here? py-spy present, the ptrace policy (Yama's
``ptrace_scope``, ``CAP_SYS_PTRACE``, a container), and a real attach to a child process that
allows any tracer, as every rank does (``rank.arming.allow_any_tracer``)."""

from __future__ import annotations

import os
import select
import subprocess
import time
from pathlib import Path

from areal_watchdog.doctor.model import FAIL, PASS, WARN, Check
from areal_watchdog.evidence.pyspy import StackError, dump_pyspy, pyspy_executable

YAMA = Path("/proc/sys/kernel/yama/ptrace_scope")
CAP_SYS_PTRACE = 19
CONTAINER_FILES = ("/.dockerenv", "/run/.containerenv")
CGROUP_HINTS = ("docker", "kubepods", "containerd", "libpod", "lxc", "crio")
PTRACE_FIX = (
    "run the sidecar as the ranks' user with CAP_SYS_PTRACE (containers: --cap-add SYS_PTRACE), "
    "or set kernel.yama.ptrace_scope=1; until then stacks come from the cooperative dump"
)
_TARGET = (
    "import sys\n"
    "from areal_watchdog.rank.arming import allow_any_tracer\n"
    "allow_any_tracer()\n"
    "print('ready', flush=True)\n"
    "sys.stdin.read()\n"
)


def yama_scope(text: str | None) -> int | None:
    """``/proc/sys/kernel/yama/ptrace_scope`` as a number; None without Yama."""
    try:
        return int((text or "").strip())
    except ValueError:
        return None


def effective_caps(status_text: str) -> int:
    """The ``CapEff`` bit mask of a ``/proc/<pid>/status`` text (0 when absent)."""
    for line in status_text.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split(":", 1)[1].strip(), 16)
    return 0


def container_kind(exists: dict[str, bool], cgroup_text: str, env_container: str) -> str | None:
    """Which container this process seems to run in (None: none seen)."""
    if env_container:
        return env_container
    for path in CONTAINER_FILES:
        if exists.get(path):
            return "podman" if "containerenv" in path else "docker"
    for hint in CGROUP_HINTS:
        if hint in cgroup_text:
            return hint
    return None


def policy(scope: int | None, caps: int, container: str | None, uid: int) -> Check:
    """What the kernel lets a sidecar of the ranks' user do, before anything is tried."""
    cap = bool(caps >> CAP_SYS_PTRACE & 1)
    who = "root" if uid == 0 else f"uid {uid}"
    parts = [
        who,
        "no Yama" if scope is None else f"Yama ptrace_scope={scope}",
        "CAP_SYS_PTRACE" if cap else "no CAP_SYS_PTRACE",
        f"in a container ({container})" if container else "no container",
    ]
    detail = ", ".join(parts)
    if scope == 3:
        return Check("ptrace", FAIL, f"{detail}: nobody may attach", PTRACE_FIX)
    if scope == 2 and not cap:
        return Check("ptrace", FAIL, f"{detail}: only CAP_SYS_PTRACE may attach", PTRACE_FIX)
    if container and not cap:
        return Check("ptrace", WARN, f"{detail}: seccomp may refuse ptrace", PTRACE_FIX)
    if scope == 1:
        detail += " (the ranks allow any tracer: PR_SET_PTRACER)"
    return Check("ptrace", PASS, detail)


def read_policy() -> Check:
    """``policy`` of this process, read from ``/proc``."""
    try:
        scope_text: str | None = YAMA.read_text()
    except OSError:
        scope_text = None
    status = _read("/proc/self/status")
    exists = {p: os.path.exists(p) for p in CONTAINER_FILES}
    runtime = os.environ.get("container", "")  # noqa: SIM112 - the name systemd and podman set
    kind = container_kind(exists, _read("/proc/1/cgroup"), runtime)
    return policy(yama_scope(scope_text), effective_caps(status), kind, os.getuid())


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def check_pyspy() -> Check:
    exe = pyspy_executable()
    if exe is None:
        return Check(
            "py-spy", FAIL, "not installed", "pip install py-spy into launch.python's venv"
        )
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
        version = out.stdout.strip() or "version unknown"
    except (OSError, subprocess.SubprocessError) as exc:
        return Check("py-spy", FAIL, f"{exe} does not run: {exc}", "reinstall py-spy")
    return Check("py-spy", PASS, f"{exe} ({version})")


def check_attach(python: str, timeout: float = 10.0) -> Check:
    """py-spy on a short-lived child that allows any tracer, as a rank does."""
    if pyspy_executable() is None:
        return Check("py-spy attach", FAIL, "py-spy is not installed", "pip install py-spy")
    try:
        child = subprocess.Popen(
            [python, "-c", _TARGET], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
    except OSError as exc:
        return Check(
            "py-spy attach",
            FAIL,
            f"cannot start {python}: {exc.strerror}",
            "set launch.python to an interpreter with areal-watchdog",
        )
    try:
        return _attach(child, timeout)
    finally:
        child.kill()
        child.wait()


def _attach(child: subprocess.Popen[bytes], timeout: float) -> Check:
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], timeout)
    if not ready or child.stdout.readline().strip() != b"ready":
        return Check(
            "py-spy attach",
            FAIL,
            "the test process did not start",
            "check that launch.python imports areal_watchdog",
        )
    started = time.perf_counter()
    try:
        threads = dump_pyspy(child.pid, timeout)
    except StackError as exc:
        fix = PTRACE_FIX if exc.permission else "run py-spy dump --pid PID by hand to see why"
        return Check("py-spy attach", FAIL, f"refused on a child process: {exc}", fix)
    took = (time.perf_counter() - started) * 1000
    frames = sum(len(t.frames) for t in threads)
    detail = f"a child process: {len(threads)} thread(s), {frames} frame(s) in {took:.0f} ms"
    if not frames:
        return Check("py-spy attach", WARN, detail, "py-spy saw no Python frame: upgrade py-spy")
    return Check("py-spy attach", PASS, detail)
