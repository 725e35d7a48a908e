"""node_exporter's textfile collector: ``<dir>/areal_watchdog_<run_id>_<node>.prom``, replaced
atomically (a hidden temporary file, then a rename in the same directory: node_exporter never
reads half a file, and reads no name but ``*.prom``), readable by node_exporter's user, and
removed when the job ends, so that a finished job leaves no series behind."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path

from areal_watchdog.common.atomic import write_text_atomic
from areal_watchdog.rundir.sidecar_files.metrics_endpoint import READABLE, node_file_stem


def textfile_path(directory: str, run_id: str, node: str) -> Path:
    return Path(directory) / f"{node_file_stem(run_id, node)}.prom"


def write_textfile(path: Path, text: bytes) -> None:
    write_text_atomic(path, text, mode=READABLE)


def remove_textfile(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


class TextfileWriter:
    """Writes the file off the sidecar's poll, in a thread of its own: a poll only says that a
    new snapshot is there (rendering and writing cost about 0.8 ms; a poll's budget for the
    metrics is 1 ms). Writes coalesce: a slow disk skips snapshots, never queues them."""

    def __init__(self, path: Path, render: Callable[[], bytes], log: Callable[[str], None]) -> None:
        self.path, self.render, self.log = path, render, log
        self.fresh, self.stopping = threading.Event(), False
        self.thread = threading.Thread(
            target=self._run, name="areal-watchdog-textfile", daemon=True
        )
        self.thread.start()

    def changed(self) -> None:
        self.fresh.set()

    def close(self) -> None:
        """Stop writing, then remove the file (the job ended: no stale series behind it)."""
        self.stopping = True
        self.fresh.set()
        self.thread.join(timeout=5)
        remove_textfile(self.path)

    def _run(self) -> None:
        while True:
            self.fresh.wait()
            self.fresh.clear()
            if self.stopping:
                return
            try:
                write_textfile(self.path, self.render())
            except OSError as exc:
                self.log(f"cannot write the metrics textfile {self.path}: {exc}")
