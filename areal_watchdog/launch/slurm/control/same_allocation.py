"""``watchdog.resume.allocation: same``: a hang ends the job's steps, not the job.

The batch script keeps the allocation and waits (``await_decision``, run by the teardown
lines of ``templates/slurm_teardown_same_allocation.sh``) while the launcher, which follows the
job, decides and replays on a node of the allocation; then it starts the sidecars and the job's
step again (``resume``) or ends (``stop``). The decision travels as a file of the run
directory: ``attempt_ended.json`` from the batch script, ``resume_request.json`` back. A resumed
step reads the new attempt's run id and resume variables from it (``resumed_attempt``): the
task submitit pickled at submission cannot change.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from areal_watchdog.common.atomic import read_json, write_json_atomic
from areal_watchdog.rundir.layout import ENV_RUN_ID, RunLayout
from areal_watchdog.rundir.sidecar_files.hang_request import HangRequest

ENV_PREFIX = "AREAL_WATCHDOG_"
DECISION_TIMEOUT = 3600.0  # seconds the allocation waits for a launcher that says nothing


def request(
    layout: RunLayout, job_id: str, decision: str, run_id: str, env: dict[str, str]
) -> None:
    """The launcher's answer to a batch script waiting after a hang."""
    record = {"job_id": job_id, "decision": decision, "run_id": run_id, "env": env,
              "time": time.time()}  # fmt: skip
    write_json_atomic(layout.resume_request_file, record)


def attempt_ended(layout: RunLayout, job_id: str) -> bool:
    """Whether the batch script of ``job_id`` waits for a decision."""
    record = read_json(layout.attempt_ended_file)
    return isinstance(record, dict) and record.get("job_id") == job_id


def resumed_attempt(run_dir: str) -> tuple[str, dict[str, str]] | None:
    """A resumed attempt's run id and the variables the launcher asked for (run id
    included), or None when this job's step is its first attempt."""
    record = read_json(RunLayout(Path(run_dir)).resume_request_file)
    if not isinstance(record, dict) or record.get("job_id") != os.environ.get("SLURM_JOB_ID"):
        return None
    run_id, env = record.get("run_id"), record.get("env")
    if not isinstance(run_id, str) or not run_id or not isinstance(env, dict):
        return None
    return run_id, {k: v for k, v in env.items() if _ours(k, v)} | {ENV_RUN_ID: run_id}


def _ours(key: object, value: object) -> bool:
    """A variable the launcher may hand a resumed step: only the watchdog's own (a request
    naming LD_PRELOAD or PATH is never believed)."""
    return isinstance(key, str) and key.startswith(ENV_PREFIX) and isinstance(value, str)


def await_decision(run_dir: Path, timeout: float = DECISION_TIMEOUT) -> int:
    """In the batch script: 0 to run the step again, 1 to end the job. Only a hang the
    watchdog ended (its cancel record) is waited for, at most ``timeout`` seconds."""
    layout, job_id = RunLayout(run_dir), os.environ.get("SLURM_JOB_ID", "")
    request = HangRequest.read(layout)
    if request is None:
        return 1
    write_json_atomic(layout.attempt_ended_file, {"job_id": job_id, "time": time.time(),
                                                  "run_id": request.run_id})  # fmt: skip
    print(f"[areal-watchdog] the step ended after a hang: waiting for areal-launch's decision "
          f"(at most {timeout:g} s)", flush=True)  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = read_json(layout.resume_request_file)
        if (
            isinstance(answer, dict)
            and answer.get("job_id") == job_id
            and answer.get("run_id") != request.run_id
        ):
            print(f"[areal-watchdog] areal-launch says: {answer.get('decision')}", flush=True)
            return 0 if answer.get("decision") == "resume" else 1
        time.sleep(1.0)
    print("[areal-watchdog] no decision from areal-launch: ending the job", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(await_decision(Path(sys.argv[1])))
