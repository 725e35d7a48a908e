"""A run of an AReaL case inside a loopback-only network namespace (``scripts/loopback.sh``),
where AReaL's ``0.0.0.0`` binds and advertised addresses are loopback ones: the benchmark's
webhook receiver lives in the root namespace and cannot be reached from inside, so a receiver of
its own runs beside the job here and writes each request it gets (its arrival, its body) to a
JSON-lines file that ``AreaLWatchdog.signal`` reads.

``python -m benchmarks.hangbench.loopback_run HOOKS.jsonl -- COMMAND...``, inside the namespace,
``BENCH_HOOK_SECRET`` in the environment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from testkit.receiver import Receiver


def main() -> int:
    hooks, command = Path(sys.argv[1]), sys.argv[sys.argv.index("--") + 1 :]
    receiver = Receiver(os.environ["BENCH_HOOK_SECRET"])
    env = {**os.environ, "BENCH_HOOK_URL": receiver.url()}
    job = subprocess.Popen(command, env=env)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: job.send_signal(signum))
    written = 0
    while True:
        done = job.poll() is not None
        with hooks.open("a") as fh:
            for request in receiver.requests[written:]:
                fh.write(json.dumps({"wall": request.wall, "body": request.json()}) + "\n")
                written += 1
        if done:
            return job.returncode
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
