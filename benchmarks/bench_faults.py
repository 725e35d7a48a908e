"""Faults injected into real runs of the demo: does a report get lost, does a process outlive the
run, does anyone get paged for nothing? Every figure should be zero.

Each fault runs the real launcher (4 ranks on gloo, ``examples/hang_demo``) for at most ~60 s
and cleans up after itself. A report is *expected* when the job really hangs; a page is *false*
when a report is written for a job that did not hang (an interrupt, a lost run directory).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "hang_demo" / "config.yaml"
FAST = ["watchdog.stall_timeout=3", "watchdog.poll_interval=0.25", "watchdog.on_hang=cancel",
        "demo.step_time=0.1", "launch.nproc_per_node=3"]  # fmt: skip
HANG = ["demo.hang=collective_mismatch", "demo.hang_step=6"]
HEALTHY = ["demo.hang=none", "demo.steps=400"]
Rows = list[tuple[str, str, str]]


class Run:
    """One launch of the demo under a fresh fileroot."""

    def __init__(self, root: Path, overrides: list[str]) -> None:
        self.root = root
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "areal_watchdog.cli", "--watchdog", "local", str(DEMO),
             f"cluster.fileroot={root}", "trial_name=t", *FAST, *overrides],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
            start_new_session=True,
        )  # fmt: skip
        self.output = ""

    @property
    def run_dir(self) -> Path:
        return self.root / "hang-demo" / "t"

    def wait_for(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and text not in self.output:
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                return
            self.output += line

    def finish(self, timeout: float = 90) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.output += self.proc.communicate(timeout=timeout)[0]

    def reports(self) -> int:
        return len(list(self.run_dir.glob("incidents/*/report.json")))

    def leftovers(self) -> int:
        time.sleep(2)
        left = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if proc.environ().get("AREAL_WATCHDOG_DIR", "").startswith(str(self.root)):
                    left.append(proc)
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        return len(left)


def _sidecar_kill(run: Run) -> None:
    run.wait_for("first step seen")
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if "areal_watchdog.watch.sidecar" in proc.cmdline() and str(run.root) in " ".join(
                proc.cmdline()
            ):
                proc.kill()


def _launcher_kill(run: Run) -> None:
    run.wait_for("first step seen")
    run.proc.kill()


def _signal(*signals: int) -> Callable[[Run], None]:
    def inject(run: Run) -> None:
        run.wait_for("first step seen")
        for sig in signals:
            run.proc.send_signal(sig)
            time.sleep(0.2)

    return inject


def _delete_run_dir(run: Run) -> None:
    run.wait_for("first step seen")
    shutil.rmtree(run.run_dir, ignore_errors=True)


def _full_disk(run: Run) -> None:
    run.wait_for("Train step 5")
    filler = run.root / "filler"
    with open(filler, "wb") as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()
    run.wait_for("report not on disk yet", timeout=30)
    filler.unlink()


# fault, overrides, injection, reports expected, needs a 2 MB filesystem
FAULTS = [
    ("sidecar kill -9, then a hang", HANG, _sidecar_kill, 1, False),
    ("launcher kill -9 (healthy job)", HEALTHY, _launcher_kill, 0, False),
    ("SIGHUP to the launcher", HEALTHY, _signal(signal.SIGHUP), 0, False),
    ("Ctrl-C", HEALTHY, _signal(signal.SIGINT), 0, False),
    ("double Ctrl-C", HEALTHY, _signal(signal.SIGINT, signal.SIGINT), 0, False),
    ("run directory deleted (healthy job)", [*HEALTHY[:1], "demo.steps=40"], _delete_run_dir, 0,
     False),
    ("disk full during a hang", HANG, _full_disk, 1, True),
]  # fmt: skip


def _tiny_root() -> tuple[Path, Callable[[], None]] | None:
    mount = Path(tempfile.mkdtemp(prefix="areal-bench-tiny-"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=1777", "tmpfs", str(mount)],
        capture_output=True,
    )
    if done.returncode:
        return None
    return mount, lambda: subprocess.run(["umount", "-l", str(mount)], check=False)


def run_fault(name: str, overrides: list[str], inject: Callable[[Run], None], expected: int,
              tiny: bool) -> tuple[str, str, str]:  # fmt: skip
    cleanup: Callable[[], None] = lambda: None  # noqa: E731
    if tiny:
        made = _tiny_root() if os.geteuid() == 0 else None
        if made is None:
            return name, "skipped (needs root for a tmpfs)", "0 / 0 / 0"
        root, cleanup = made
    else:
        root = Path(tempfile.mkdtemp(prefix="areal-bench-fault-"))
    try:
        run = Run(root, overrides)
        inject(run)
        run.finish()
        found = run.reports()
        lost, false_pages = max(0, expected - found), max(0, found - expected)
        left = run.leftovers()
    finally:
        cleanup()
        shutil.rmtree(root, ignore_errors=True)
    return name, f"{lost} / {left} / {false_pages}", "0 / 0 / 0"


def _trickle_and_ledger() -> Rows:
    """Notification faults, through the same code the sidecar uses."""
    from areal_watchdog.common.secrets.redact import Redactor
    from areal_watchdog.config.sinks import parse_sinks, resolve
    from areal_watchdog.notify.delivery import Spool, send

    server = __import__("socket").socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def trickle() -> None:
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
            for _ in range(100):
                time.sleep(1)
                conn.send(b"x")

    threading.Thread(target=trickle, daemon=True).start()
    os.environ["BENCH_HOOK"] = f"http://127.0.0.1:{server.getsockname()[1]}/"
    spec = parse_sinks([{"type": "webhook", "url_env": "BENCH_HOOK", "timeout": 3,
                         "max_attempts": 1}], "bench")[0]  # fmt: skip
    started = time.monotonic()
    outcome = send(resolve(spec), b"{}", "bench-1", Redactor())
    took = time.monotonic() - started
    server.close()
    with tempfile.TemporaryDirectory() as tmp:
        spool = Spool(Path(tmp))
        spool.mark_delivered("a")
        with open(spool.delivered_log, "a", encoding="utf-8") as fh:
            fh.write('{"id": "b", "ti')
        spool.mark_delivered("c")
        lost_ids = {"a", "c"} - spool.delivered_ids()
    return [
        ("trickling receiver (timeout 3 s): send returns after", f"{took:.1f} s "
         f"({'retryable' if outcome.retryable else 'dropped'})", "<= 4 s"),
        ("damaged spool ledger: deliveries forgotten", str(len(lost_ids)), "0"),
    ]  # fmt: skip


def run_fault_benchmarks(quick: bool = False) -> list[tuple[str, Rows]]:
    rows = [run_fault(*fault) for fault in FAULTS]
    return [
        ("Faults (reports lost / processes left / false pages)", rows),
        ("Notification faults", _trickle_and_ledger()),
    ]
