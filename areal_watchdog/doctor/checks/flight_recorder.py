"""Does the job's torch record collectives under the variables the launcher exports? A 1-rank
gloo process group in a child of ``launch.python``, with the rendered debug environment: one
``all_reduce``, then the dump the rank listener takes (``_dump_fr_trace_json``) and the one
NCCL's pipe writes (``_dump_fr_trace``) must both hold entries. A few seconds (torch's import).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from areal_watchdog.config.debug_env import render_debug_env
from areal_watchdog.doctor.model import FAIL, PASS, WARN, Check

TIMEOUT = 60.0
FIX = (
    "set watchdog.debug_env.TORCH_FR_BUFFER_SIZE (older torch reads TORCH_NCCL_TRACE_BUFFER_SIZE: "
    "set both) to 2000, or upgrade torch; until then reports use stacks only"
)


def check_flight_recorder(python: str, debug_env: dict[str, str], enabled: bool) -> Check:
    if not enabled:
        return Check("flight recorder", PASS, "off (watchdog.flight_recorder: false)")
    with tempfile.TemporaryDirectory(prefix="areal-doctor-fr-") as watch_dir:
        env = {**os.environ, **render_debug_env(debug_env, watch_dir)}
        try:
            out = subprocess.run(
                [python, "-m", __name__], capture_output=True, text=True, timeout=TIMEOUT, env=env
            )
        except subprocess.TimeoutExpired:
            return Check("flight recorder", WARN, f"no answer in {TIMEOUT:g} s", FIX)
        except OSError as exc:
            return Check(
                "flight recorder",
                FAIL,
                f"cannot run {python}: {exc.strerror}",
                "set launch.python to an interpreter with torch",
            )
    return judge(out.stdout, out.stderr)


def judge(stdout: str, stderr: str) -> Check:
    """The probe's JSON line turned into a check."""
    try:
        found: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        last = (stderr.strip().splitlines() or ["no output"])[-1][:200]
        return Check("flight recorder", FAIL, f"the probe failed: {last}", FIX)
    if "error" in found:
        return Check(
            "flight recorder", FAIL, f"torch {found.get('torch', '?')}: {found['error']}", FIX
        )
    counts = f"{found['json_entries']} (json) and {found['entries']} (pickle) entries"
    detail = f"torch {found['torch']}: a 1-rank gloo all_reduce dumped {counts}"
    if found["json_entries"] and found["entries"]:
        return Check("flight recorder", PASS, detail)
    return Check("flight recorder", FAIL, detail, FIX)


def probe() -> dict[str, Any]:
    """In the child: record one collective and count what the dumps hold."""
    import pickle

    import torch
    import torch.distributed as dist

    found: dict[str, Any] = {"torch": torch.__version__}
    try:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        dist.all_reduce(torch.ones(2))
        c10d = torch._C._distributed_c10d
        found["json_entries"] = len(json.loads(c10d._dump_fr_trace_json()).get("entries", []))
        found["entries"] = len(pickle.loads(c10d._dump_fr_trace()).get("entries", []))
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - said in the table
        found["error"] = f"{type(exc).__name__}: {exc}"[:200]
    return found


if __name__ == "__main__":
    print(json.dumps(probe()))
    sys.exit(0)
