"""A sidecar's late finish: what it had not drawn or sent when the job ended goes on here, in a
process of its own, so that the launcher (and on a scheduler, the allocation) is never held by a
picture or a slow channel.

``python -m areal_watchdog.watch.timelines.late_finish --run-dir RUN_DIR --node NODE [--draw
INCIDENT_DIR] [--upload INCIDENT_DIR]``

Started detached by the sidecar (``job_end.JobEnd.wind_down``), which records it first
(``rundir/sidecar_files/late_finish.py``). It sends the spooled notifications (reports first: a
picture goes into the thread a report started), draws the timelines, uploads them, and ends by
``LATE_FINISH_LIMIT_S`` whatever is left: what was not sent stays in the spool, retried by any
later ``areal-launch`` command on the run. Its lines go to the node's sidecar log.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import open_append
from areal_watchdog.common.secrets.redact import Redactor
from areal_watchdog.config.sinks import SinkSpec
from areal_watchdog.notify.notifier import Picture, deliver_spooled, upload_picture
from areal_watchdog.notify.spool import Spool
from areal_watchdog.report import picture
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.sidecar_files.late_finish import LateFinish

LATE_FINISH_LIMIT_S = 120.0  # a slow channel's retries and a drawing on a loaded machine
RECORD_WAIT_S = 5.0  # for the sidecar's record of this process, written just after its start


class _OutOfTime(Exception):
    """The limit came (SIGALRM)."""


def _out_of_time(_signum: int, _frame: Any) -> None:
    raise _OutOfTime


class _Finish:
    """One late finish: its record, kept current, and its lines in the sidecar log."""

    def __init__(self, layout: RunLayout, record: LateFinish) -> None:
        self.layout, self.record = layout, record
        self.log_file: Any = None

    def log(self, message: str) -> None:
        with contextlib.suppress(OSError):
            if self.log_file is None:
                path = self.layout.logs_dir / f"sidecar_{self.record.node}.log"
                self.log_file = open_append(path)
            self.log_file.write(f"{time.strftime('%H:%M:%S')} late finish: {message}\n")
            self.log_file.flush()

    def waiting_for(self, *what: str) -> None:
        self.record = self.record.progressed(tuple(w for w in what if w))
        with contextlib.suppress(OSError):
            self.record.write(self.layout)

    def over(self, outcome: str) -> None:
        self.record = self.record.over(outcome)
        with contextlib.suppress(OSError):
            self.record.write(self.layout)
        self.log(outcome)


def finish_late(info: LaunchInfo, finish: _Finish, draw: list[Path], upload: list[Path]) -> str:
    """Send, draw, upload; what was done, in words."""
    layout = info.layout
    drawing = [f"drawing the timeline of {f.name}" for f in draw]
    finish.waiting_for("sending the spooled notifications", *drawing)
    sent, left = deliver_spooled(layout.spool_dir, finish.log)
    drawn = 0
    for i, folder in enumerate(draw):
        finish.waiting_for(*drawing[i:])
        started = time.monotonic()
        picture.main([str(folder)])
        drawn += (folder / "timeline.png").exists()
        finish.log(f"the timeline of {folder.name} drawn in {time.monotonic() - started:.1f} s")
    specs = [SinkSpec.from_dict(d) for d in info.watchdog.notify]
    spool, redactor = Spool(layout.spool_dir, finish.log), Redactor.from_environment()
    for folder in [*draw, *upload]:
        finish.waiting_for(f"uploading the timeline of {folder.name}")
        if (folder / "timeline.png").exists():
            shown = Picture(folder.name, folder / "timeline.png", f"Timeline of {folder.name}")
            upload_picture(specs, spool, shown, redactor, finish.log)
    return f"done: {sent} notification(s) sent, {left} left in the spool, {drawn} timeline(s) drawn"


def _own_record(layout: RunLayout, node: str) -> LateFinish | None:
    """The sidecar's record of this process (it writes it just after starting us)."""
    deadline = time.monotonic() + RECORD_WAIT_S
    while time.monotonic() < deadline:
        found = [r for r in LateFinish.read_all(layout) if r.node == node]
        if found and found[0].pid == os.getpid():
            return found[0]
        time.sleep(0.05)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m areal_watchdog.watch.timelines.late_finish",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--node", required=True)
    parser.add_argument("--draw", action="append", type=Path, default=[], metavar="INCIDENT_DIR")
    parser.add_argument("--upload", action="append", type=Path, default=[], metavar="INCIDENT_DIR")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGALRM, _out_of_time)
    signal.alarm(int(LATE_FINISH_LIMIT_S))
    try:
        info = LaunchInfo.load(args.run_dir)
        record = _own_record(info.layout, args.node)
    except Exception as exc:  # noqa: BLE001 - a late finish explains, never crashes
        print(f"[areal-watchdog] late finish cannot start: {exc}", file=sys.stderr)
        return 2
    if record is None:
        return 2  # not started by a sidecar that recorded it
    finish = _Finish(info.layout, record)
    try:
        finish.over(finish_late(info, finish, args.draw, args.upload))
    except _OutOfTime:
        finish.over(
            f"stopped at its {LATE_FINISH_LIMIT_S:g} s limit; what was not sent stays in the spool"
        )
    except Exception as exc:  # noqa: BLE001 - said in the record and the log
        finish.over(f"failed: {type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
