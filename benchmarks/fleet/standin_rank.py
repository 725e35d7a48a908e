"""A stand-in rank of ``bench_sidecars``: a step a second (rank 0 prints AReaL's step line, which
the leading sidecar follows), a heartbeat each step; on SIGUSR2 it stops stepping (stuck, as in
a collective that never completes, still answering signals), on SIGUSR1 it returns (an exit
record, as a finished rank writes). Run under our rank wrapper, as torchrun runs a real rank."""

from __future__ import annotations

import os
import signal
import time

import areal_watchdog

_stop = _stuck = False


def _end(_signum: int, _frame: object) -> None:
    global _stop
    _stop = True


def _stick(_signum: int, _frame: object) -> None:
    global _stuck
    _stuck = True


signal.signal(signal.SIGUSR1, _end)
signal.signal(signal.SIGUSR2, _stick)
rank, step = int(os.environ["RANK"]), 0
while not _stop:
    time.sleep(float(os.environ.get("BENCH_STEP_TIME", "1")))
    if _stuck:
        continue
    step += 1
    areal_watchdog.heartbeat(step)
    if rank == 0:
        print(f"(AReaL) StatsLogger INFO: Epoch 1/1 Step {step}/100000 Train step {step}/100000 "
              "done.", flush=True)  # fmt: skip
