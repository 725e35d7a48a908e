"""The timelines of posted incidents, each drawn by a process of its own once its report is
posted (``report/picture.py``): a picture is never why a report is late. The sidecar reaps them
each poll; at its exit it waits a few seconds for the ones still drawing and hands the rest to
its late finish (``late_finish.py``): a picture never holds the launcher. Each dies with the
sidecar."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

from areal_watchdog.common.interprocess.parent import die_with_parent
from areal_watchdog.notify.notifier import Picture


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
            folder = incident_dir(proc)
            if proc.returncode:
                self.log(f"the timeline's drawing {folder} exited {proc.returncode}")
            elif (folder / "timeline.png").exists():
                title = f"Timeline of {folder.name}"
                self.on_drawn(Picture(folder.name, folder / "timeline.png", title))

    def settle(self, deadline: float) -> list[Path]:
        """Let the drawings still running finish until ``deadline`` (monotonic); end the rest
        and return their incident folders, for a late finish to draw again."""
        unfinished = []
        for proc in self.running:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                unfinished.append(incident_dir(proc))
        self.running = [p for p in self.running if incident_dir(p) not in unfinished]
        self.reap()
        return unfinished


def incident_dir(drawing: subprocess.Popen) -> Path:
    """The incident folder a drawing process draws (its last argument)."""
    return Path(cast(list[str], drawing.args)[-1])
