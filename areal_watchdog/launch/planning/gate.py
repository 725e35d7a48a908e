"""Wait at a Gate (``launch.planning.plan``): until AReaL's inference servers registered in
name_resolve, with progress on the terminal and a bounded wait. Used where the SPMD trainer starts:
by the local launcher, and by a Slurm node's task."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from areal_watchdog.launch.planning.plan import Gate

PROGRESS_EVERY = 30.0  # seconds between "still waiting" lines


def registered(directory: Path) -> list[str]:
    """The values of AReaL name_resolve entries under ``directory`` (``*/ENTRY`` files)."""
    values = []
    for entry in sorted(directory.glob("*/ENTRY")):
        with contextlib.suppress(OSError):
            values.append(entry.read_text().strip())
    return [v for v in values if v]


def pass_gate(
    gate: Gate, blocked: Callable[[], str | None], say: Callable[[str], None], poll: float = 0.5
) -> dict[str, str] | None:
    """The variable the gate fills, once enough entries exist; None when ``blocked`` gives a
    reason to stop waiting (a server died, the user interrupted) or the wait timed out (said)."""
    started = last_said = time.monotonic()
    say(f"waiting for {gate.count} inference server(s) to register in {gate.directory}")
    while True:
        values = registered(Path(gate.directory))
        if len(values) >= gate.count:
            say(f"{gate.env_var}={','.join(values)}")
            return {gate.env_var: ",".join(values)}
        waited = time.monotonic() - started
        reason = blocked()
        if reason is None and waited > gate.timeout:
            reason = f"not there after {gate.timeout:g} s"
        if reason:
            expected = f"{gate.count} server(s) expected in {gate.directory}"
            say(f"cannot start the job: {expected}, {reason}")
            return None
        if time.monotonic() - last_said > PROGRESS_EVERY:
            last_said = time.monotonic()
            say(f"still waiting for the inference servers ({waited:.0f} s)")
        time.sleep(poll)
