"""Which AReaL a job runs: the one way every concern that depends on AReaL's internals (the
preflight's rules, the trainer hook, the replay) picks its variant.

A concern keeps its own table keyed by release series (``"1.0"``, ``"2.0"``); an unknown
series gets one warning naming what is off, and everything that does not read AReaL's
internals works as before.
"""

from __future__ import annotations

import functools
import re
import subprocess

KNOWN_SERIES = ("1.0", "2.0")
_SERIES = re.compile(r"^(\d+)\.(\d+)")
_ASK = "import importlib.metadata as m\ntry: print(m.version('areal'))\nexcept Exception: pass"


def series(version: str | None) -> str | None:
    """``"2.0.0"`` -> ``"2.0"``; None for None or a version string that is not one."""
    match = _SERIES.match(version or "")
    return f"{match[1]}.{match[2]}" if match else None


def is_known(version: str | None) -> bool:
    return series(version) in KNOWN_SERIES


@functools.lru_cache(maxsize=8)
def installed_version(python: str) -> str | None:
    """The ``areal`` version the job's interpreter would import (its package metadata, read
    without importing AReaL: that pulls in torch); None when it has no AReaL."""
    try:
        out = subprocess.run(
            [python, "-c", _ASK], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def unknown_note(version: str | None, what: str) -> str | None:
    """One line for an AReaL this release does not know, naming ``what`` is then off."""
    if version is None or is_known(version):
        return None
    known = ", ".join(f"{s}.x" for s in KNOWN_SERIES)
    return f"AReaL {version} is not one areal-watchdog knows ({known}): {what}"
