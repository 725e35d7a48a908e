#!/usr/bin/env python3
"""Check the real NVML backend on a GPU machine: sample every GPU for a few seconds, print what
the watchdog would see, and exit non-zero if NVML cannot be used.

    pip install nvidia-ml-py && .venv/bin/python scripts/check-nvml.py [--seconds 5]

Run it once idle and once while a job trains: idle GPUs must read "idle", a training job
"working", and a job hung in a NCCL collective "spinning" (high utilisation, low power).
"""

from __future__ import annotations

import argparse
import sys
import time

from areal_watchdog.evidence.gpu import IdleTracker, NvidiaSmiBackend, NvmlBackend


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    try:
        nvml = NvmlBackend()
    except Exception as exc:  # noqa: BLE001
        print(f"NVML unavailable: {exc} (is nvidia-ml-py installed and a driver loaded?)")
        return 1
    tracker = IdleTracker()
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        samples = nvml.sample()
        tracker.update(samples, set(), time.time())
        time.sleep(1.0)
    print(f"{'gpu':>3}  {'util %':>6}  {'memory MiB':>17}  {'power W':>15}  {'pids':<12} state")
    for s in samples:
        power = f"{s.power_w:.0f}/{s.power_limit_w:.0f}" if s.power_w is not None else "n/a"
        print(
            f"{s.index:>3}  {s.utilization:>6.0f}  {s.memory_used_mb:>8.0f}/"
            f"{s.memory_total_mb:<8.0f}  {power:>15}  {','.join(map(str, s.pids)) or '-':<12} "
            f"{tracker.state(s)}"
        )
    try:
        smi = {g.index: g for g in NvidiaSmiBackend().sample()}
        same = all(smi[s.index].uuid == s.uuid for s in samples)
        print(f"nvidia-smi agrees on the devices: {'yes' if same else 'NO'}")
    except Exception as exc:  # noqa: BLE001
        print(f"nvidia-smi check skipped: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
