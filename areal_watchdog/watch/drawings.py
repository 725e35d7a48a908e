"""The timelines of posted incidents, each drawn by a process of its own once its report is
posted (``report/picture.py``): a picture is never why a report is late. The sidecar reaps them
each poll and waits for the ones still drawing before it exits, and each dies with the sidecar,
so nothing of ours outlives the job."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from areal_watchdog.common.parent import die_with_parent
from areal_watchdog.notify.notifier import Picture

DRAW_WAIT_S = 30.0  # at the sidecar's exit: matplotlib's import and a drawing take 2-5 s here


class Drawings:
    """The drawing processes this sidecar started and has not reaped yet."""

    def __init__(
        self, log: Callable[[str], None], on_drawn: Callable[[Picture], None] = lambda _p: None
    ) -> None:
        self.log = log
        self.on_drawn = on_drawn  # the notifier's: a picture for the report's threads
        self.running: list[subprocess.Popen] = []

    def start(self, incident_dir: Path) -> None:
        argv = [sys.executable, "-m", "areal_watchdog.report.picture", str(incident_dir)]
        try:
            self.running.append(
                subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    preexec_fn=die_with_parent,
                )  # fmt: skip
            )
        except OSError as exc:
            self.log(f"cannot start the timeline's drawing for {incident_dir}: {exc}")

    def reap(self) -> None:
        """Hand on the drawings that ended; log one that failed (its report.md says why)."""
        for proc in [p for p in self.running if p.poll() is not None]:
            self.running.remove(proc)
            folder = Path(proc.args[-1])
            if proc.returncode:
                self.log(f"the timeline's drawing {folder} exited {proc.returncode}")
            elif (folder / "timeline.png").exists():
                title = f"Timeline of {folder.name}"
                self.on_drawn(Picture(folder.name, folder / "timeline.png", title))

    def wait(self, timeout: float = DRAW_WAIT_S) -> None:
        """Let the drawings still running finish, at most ``timeout`` s; end the rest."""
        deadline = time.monotonic() + timeout
        for proc in self.running:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.reap()
