#!/usr/bin/env python3
"""The GPU part of scripts/gpu-check.sh: what the sidecar sees of real CUDA processes.

Two phases on GPU 0, each a child process of this script: ``idle`` holds a CUDA context and
sleeps in host code (NVML must read the GPU ``idle``), ``busy`` spins matrix products (it must
read ``working`` or ``spinning``). NVML is sampled through the watchdog's own backend; py-spy
dumps each child as the sidecar would. Everything is written under OUT; exit 1 when a phase
reads wrong or a stack cannot be taken.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from areal_watchdog.evidence.gpu import IdleTracker, NvmlBackend
from areal_watchdog.evidence.pyspy import StackError, dump_pyspy

PHASE_S = 8.0
CHILDREN = {
    "idle": "import time, torch\nx = torch.ones(1, device='cuda')\ntorch.cuda.synchronize()\n"
    "print('ready', flush=True)\ntime.sleep(600)\n",
    "busy": "import torch\na = torch.randn(4096, 4096, device='cuda')\nprint('ready', flush=True)\n"
    "while True:\n    a = (a @ a).clamp_(-1, 1)\n    torch.cuda.synchronize()\n",
}
EXPECTED = {"idle": ("idle",), "busy": ("working", "spinning")}


def phase(name: str, nvml: NvmlBackend, out: Path, samples: list[dict], start: float) -> dict:
    """Run one child, sample NVML while it runs, dump its stacks, end it."""
    child = subprocess.Popen([sys.executable, "-c", CHILDREN[name]], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        child.stdout.readline()  # ready: the CUDA context exists
        tracker, states = IdleTracker(), []
        deadline = time.monotonic() + PHASE_S
        while time.monotonic() < deadline:
            gpus = [g for g in nvml.sample() if g.index == 0]
            samples.append({"t": round(time.monotonic() - start, 2), "phase": name,
                            "gpus": [g.to_dict() for g in gpus]})  # fmt: skip
            states += [tracker.state(g) for g in gpus]
            time.sleep(0.5)
        try:
            threads = dump_pyspy(child.pid, 10.0)
            stacks = [{"thread": t.name, "frames": [f.__dict__ for f in t.frames]} for t in threads]
            (out / f"pyspy_{name}.json").write_text(json.dumps(stacks, indent=1))
            stack_ok = any(t.frames for t in threads)
        except StackError as exc:
            stack_ok, stacks = False, [{"error": str(exc)}]
    finally:
        child.kill()
        child.wait()
    settled = states[len(states) // 2 :]  # the first samples may predate the first kernel
    reads_right = bool(settled) and all(s in EXPECTED[name] for s in settled)
    return {"phase": name, "states": states, "reads_right": reads_right, "stack_ok": stack_ok}


def main(out: Path) -> int:
    nvml = NvmlBackend()
    samples: list[dict] = []
    start = time.monotonic()
    results = [phase(name, nvml, out, samples, start) for name in ("idle", "busy")]
    lines = [json.dumps({"t": s["t"], "gpus": s["gpus"]}) for s in samples]
    (out / "nvml_samples.jsonl").write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps(results, indent=1))
    for r in results:
        print(f"[gpu-check] {r['phase']}: NVML read {sorted(set(r['states']))}, "
              f"{'right' if r['reads_right'] else 'WRONG'}; py-spy stacks "
              f"{'taken' if r['stack_ok'] else 'MISSING'}")  # fmt: skip
    return 0 if all(r["reads_right"] and r["stack_ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
