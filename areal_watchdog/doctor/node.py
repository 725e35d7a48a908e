"""Every per-node check, run side by side (most wait on a child process), as one
``NodeReport``. ``python -m areal_watchdog.doctor.node SPEC_JSON`` is what ``srun`` runs on each
node of an allocation: it prints its report as one marked JSON line."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from areal_watchdog.doctor.checks.areal_hooks import check_areal
from areal_watchdog.doctor.checks.filesystem import check_filesystem
from areal_watchdog.doctor.checks.flight_recorder import check_flight_recorder
from areal_watchdog.doctor.checks.gpus import check_gpus
from areal_watchdog.doctor.checks.ptrace import check_attach, check_pyspy, read_policy
from areal_watchdog.doctor.checks.sinks import check_sinks
from areal_watchdog.doctor.model import FAIL, Check, NodeReport, NodeSpec

MARKER = "AREAL_DOCTOR_REPORT "


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def node_checks(spec: NodeSpec) -> list[tuple[str, Callable[[], list[Check]]]]:
    """Each group of checks by the name it goes by when it crashes."""
    return [
        ("py-spy", lambda: [check_pyspy()]),
        ("ptrace", lambda: [read_policy()]),
        ("py-spy attach", lambda: [check_attach(spec.python)]),
        ("gpus", lambda: [check_gpus(spec.gpu_backend, spec.gpu_recording, spec.gpus_needed)]),
        (
            "flight recorder",
            lambda: [check_flight_recorder(spec.python, spec.debug_env, spec.flight_recorder)],
        ),
        ("run dir filesystem", lambda: check_filesystem(spec.probe_dir, spec.shared_dir)),
        ("areal", lambda: check_areal(spec.python, spec.areal_needed)),
        ("notify", lambda: check_sinks(spec.notify)),
    ]


def run_node(spec: NodeSpec) -> NodeReport:
    """This node's report; a check that crashes is a failed check, never a traceback."""
    started = time.time()
    groups = node_checks(spec)
    with ThreadPoolExecutor(max_workers=len(groups)) as pool:
        results = list(pool.map(lambda group: _guarded(*group), groups))
    return NodeReport(node_name(), started, [check for found in results for check in found])


def _guarded(name: str, run: Callable[[], list[Check]]) -> list[Check]:
    try:
        return run()
    except Exception as exc:  # noqa: BLE001 - said in the table
        return [
            Check(
                name,
                FAIL,
                f"the check itself failed: {type(exc).__name__}: {exc}"[:300],
                "report this as a bug of areal-watchdog",
            )
        ]


def main(argv: list[str]) -> int:
    spec = NodeSpec.from_dict(json.loads(argv[0]))
    print(MARKER + json.dumps(run_node(spec).to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
