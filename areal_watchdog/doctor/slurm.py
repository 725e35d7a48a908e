"""The doctor on every node of a Slurm allocation: one overlapping step with a task per node
(as the sidecars run, ``launch.slurm.backend``), each printing its ``NodeReport``; then the
clock skew between the nodes, from when each started."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from typing import Any

from areal_watchdog.common.errors import UserError
from areal_watchdog.doctor.model import FAIL, PASS, WARN, Check, NodeReport, NodeSpec
from areal_watchdog.doctor.node import MARKER
from areal_watchdog.watch.parts.launcher_heartbeat import LAUNCHER_SILENCE_S

TIMEOUT = 300.0
SKEW_PASS_S = 1.0
NODES_FIX = "check that launch.python and areal-watchdog exist on every node"
CLOCK_FIX = "synchronise the nodes' clocks (chrony or ntpd)"


def allocated_nodes(env: dict[str, str]) -> int:
    """How many nodes this allocation holds."""
    value = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or ""
    if not value.isdigit() or int(value) < 1:
        raise UserError(
            "SLURM_JOB_NUM_NODES is not set: run the doctor inside an allocation "
            "(salloc -N 2 areal-launch doctor --slurm CONFIG)"
        )
    return int(value)


def srun_command(spec: NodeSpec, nodes: int, slurm: dict[str, Any]) -> list[str]:
    """``srun --overlap`` one task per node running the per-node checks."""
    prefix = slurm.get("container_prefix") or []
    container = shlex.split(prefix) if isinstance(prefix, str) else [str(p) for p in prefix]
    return [
        "srun",
        "--overlap",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=0",
        *[str(a) for a in slurm.get("srun_args") or []],
        *container,
        spec.python,
        "-m",
        "areal_watchdog.doctor.node",
        json.dumps(spec.to_dict()),
    ]


def run_step(command: list[str], nodes: int) -> tuple[list[NodeReport], list[Check]]:
    """The nodes' reports, and a failed check when some node did not answer."""
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    except FileNotFoundError:
        raise UserError("srun is not on PATH: run the doctor where Slurm's client is") from None
    except subprocess.TimeoutExpired:
        return [], [
            Check(
                "nodes",
                FAIL,
                f"srun did not end within {TIMEOUT:g} s",
                "check the allocation with squeue; run the doctor again",
            )
        ]
    reports = parse_reports(out.stdout)
    if len(reports) >= nodes:
        return reports, []
    why = (out.stderr.strip().splitlines() or [f"srun exited {out.returncode}"])[-1][:200]
    return reports, [
        Check("nodes", FAIL, f"{len(reports)} of {nodes} node(s) answered: {why}", NODES_FIX)
    ]


def parse_reports(stdout: str) -> list[NodeReport]:
    reports = []
    for line in stdout.splitlines():
        if line.startswith(MARKER):
            try:
                reports.append(NodeReport.from_dict(json.loads(line[len(MARKER) :])))
            except (ValueError, TypeError):
                continue
    return reports


def skew_check(reports: list[NodeReport]) -> Check:
    """The spread of the nodes' clocks when their checks started (srun starts every task at
    once: the spread bounds the skew). Ray's sidecars judge the launcher's heartbeat by the
    clock: a skew near ``LAUNCHER_SILENCE_S`` makes a live launcher look gone."""
    if len(reports) < 2:
        return Check("clock skew", PASS, "single node")
    times = sorted((r.started, r.node) for r in reports)
    spread = times[-1][0] - times[0][0]
    detail = f"{spread:.2f} s between {times[0][1]} and {times[-1][1]} ({len(reports)} nodes)"
    if spread <= SKEW_PASS_S:
        return Check("clock skew", PASS, detail)
    if spread < LAUNCHER_SILENCE_S / 2:
        return Check("clock skew", WARN, detail + ": reports' times disagree", CLOCK_FIX)
    return Check(
        "clock skew",
        FAIL,
        detail + f": over {LAUNCHER_SILENCE_S / 2:g} s, a live "
        "launcher looks silent to Ray's sidecars",
        CLOCK_FIX,
    )


def in_allocation(env: dict[str, str] | None = None) -> bool:
    return bool((os.environ if env is None else env).get("SLURM_JOB_ID"))
