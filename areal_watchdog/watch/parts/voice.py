"""How a sidecar speaks: a status line on its terminal only when something changed, and every
line in its node's log file, scrubbed of the job's secrets. The notifier and every part of the
sidecar speak through it."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import IO, Any

from areal_watchdog.common.atomic import open_append
from areal_watchdog.common.secrets.redact import Redactor


class Voice:
    """One node's sidecar lines: the terminal's and its log file's."""

    def __init__(self, node: str, logs_dir: Path, redactor: Redactor, out: IO[str]) -> None:
        self.node, self.logs_dir, self.out = node, logs_dir, out
        self.redactor = redactor  # the notifier's, once built: it knows the channels' secrets
        self.log_file: Any = None  # this node's sidecar log, once opened
        self.last_said = ""

    def say(self, message: str) -> None:
        """One status line on the terminal, only when something changed."""
        if message == self.last_said:
            return
        self.last_said = message
        self.log(message)
        with contextlib.suppress(OSError, ValueError):  # a terminal that closed
            print(f"[areal-watchdog {self.node}] {message}", file=self.out, flush=True)

    def log(self, message: str) -> None:
        """A line in this node's sidecar log file (best effort: a full disk loses lines). The
        file stays open: one open for the sidecar's life, not one a line on the shared
        filesystem; a write that fails opens it again next time."""
        try:
            if self.log_file is None:
                self.log_file = open_append(self.logs_dir / f"sidecar_{self.node}.log")
            line = f"{time.strftime('%H:%M:%S')} {self.redactor.scrub(message)}\n"
            self.log_file.write(line)
            self.log_file.flush()
        except (OSError, AttributeError, ValueError):
            self.log_file = None
