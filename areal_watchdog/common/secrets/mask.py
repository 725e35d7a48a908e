"""Mask the secrets the launcher knows in the job's own output, as CI systems do: ``***``.

The values: the ``launch.env`` variables whose values the run directory never stores (a
secret-looking name, or a value that looks like a token: ``launch.planning.job.masked_names``) and
every notify secret (its URL, the URL's path and query, a signing secret, a bot token), gathered by
``rundir.job_mask`` from the run's records. The launcher
names the first in ``AREAL_WATCHDOG_MASKED`` (names, never values), so every process of the run
reads the same values from its own environment; the notify secrets are read from their sources
(``*_env``, ``*_file``) as the sidecar reads them. Only these exact values are masked: the job's
output is not scrubbed for shapes (``max_new_tokens=1024`` stays as printed).

The launcher masks what it writes or tees (``watchdog/logs/torchrun_<node>.log``, the terminal,
``ray_driver.log``); the rank wrapper masks the rank's ``sys.stdout`` and ``sys.stderr``, which
torchrun's per-rank logs are written from. What a rank writes to its file descriptors directly
(a subprocess, C code, ``sys.stdout.buffer``) bypasses the rank's mask.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any, TextIO

ENV_MASKED = "AREAL_WATCHDOG_MASKED"  # the names of the variables whose values are masked
MASK = "***"
MIN_LENGTH = 6  # shorter values ("1", "true") would mask ordinary words


class Mask:
    """Replaces each known value with ``***``, the longest first."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self.values = sorted({v for v in values if len(v) >= MIN_LENGTH}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for value in self.values:
            if value in text:
                text = text.replace(value, MASK)
        return text


class MaskedStream:
    """A text stream that masks whole lines before they reach ``stream``: ``print`` writes a
    value and its neighbours in separate calls. A flush passes on a partial line (a progress
    bar) masked as it is."""

    def __init__(self, stream: TextIO, mask: Mask) -> None:
        self._stream, self._mask = stream, mask
        self._pending = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            if "\n" in self._pending:
                lines, _, self._pending = self._pending.rpartition("\n")
                self._stream.write(self._mask(lines + "\n"))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        with self._lock:
            if self._pending:
                self._stream.write(self._mask(self._pending))
                self._pending = ""
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, buffer, ...
        return getattr(self._stream, name)
