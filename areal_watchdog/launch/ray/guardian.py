"""What ends a Ray run when its launcher cannot: a small process of its own session that reads
the launcher's pipe and, at its end (the launcher finished, or died to ``kill -9``), kills what
of the run is left on this machine: the own cluster's process groups (``ray start``'s reaper
does not outlive a killed launcher reliably, and Ray's dashboard agents outlive their raylet) and
every process that carries the run id (the job's driver, in a session of Ray's making), then the
own cluster's temp dir.

    python -m areal_watchdog.launch.ray.guardian RUN_DIR RUN_ID   (stdin: the launcher's pipe)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from areal_watchdog.common.atomic import read_json
from areal_watchdog.launch.ray.cluster import TEMP_ROOT, remove_private
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.run_processes import kill_run_processes


def end_the_run(layout: RunLayout, run_id: str) -> None:
    """Kill the own cluster's process groups and the run's processes on this machine; remove
    the cluster's temp dir."""
    record = read_json(layout.ray_cluster_file)
    groups = record.get("groups", []) if isinstance(record, dict) else []
    if isinstance(record, dict) and record.get("run_id") == run_id:
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
                os.killpg(int(group), signal.SIGKILL)
    kill_run_processes(run_id)
    remove_private(Path(TEMP_ROOT.format(run_id=run_id)))


def start_guardian(layout: RunLayout, run_id: str) -> subprocess.Popen:
    """The guardian, fed by a pipe only this process holds."""
    return subprocess.Popen(
        [sys.executable, "-m", __name__, str(layout.run_dir), run_id],
        stdin=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip


def main() -> int:
    run_dir, run_id = Path(sys.argv[1]), sys.argv[2]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the launcher's to handle
    while sys.stdin.buffer.read(4096):
        pass
    end_the_run(RunLayout(run_dir), run_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
