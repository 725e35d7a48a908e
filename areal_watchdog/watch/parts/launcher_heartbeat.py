"""The launcher, watched from a node where its pid cannot be (a Ray node): its heartbeat file
(``launcher.json``, written every second by ``launch.ray.run``). A sidecar whose launcher fell
silent ends everything of the run on its node, as one whose launcher died does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.run_id_check import read_run_record
from areal_watchdog.watch.parts.shared import JobView

LAUNCHER_SILENCE_S = 15.0  # a heartbeat older than this: the launcher is gone


def watch_heartbeat(
    info: LaunchInfo, view: JobView, say: Callable[[str], None], orphan: threading.Event
) -> None:
    """A thread that stops the sidecar, as orphaned, once the launcher's heartbeat is older
    than LAUNCHER_SILENCE_S (or it said it ended while the job still ran)."""

    def gone() -> bool:
        record = read_run_record(info.layout.launcher_file, info.run_id)
        if record is None:
            return False  # not written yet, or a full disk: no news is no death
        return bool(record.get("ended")) or time.time() - float(record["time"]) > LAUNCHER_SILENCE_S

    def watch() -> None:
        while not view.done:
            if gone() and not view.done:
                say("areal-launch stopped answering (its heartbeat is old)")
                orphan.set()
                view.stopping = True
                return
            time.sleep(1.0)

    threading.Thread(target=watch, daemon=True).start()
