"""Ray's Jobs API, as the launcher uses it: submit the driver, read its state, stop it.

Every failure to reach the API is one line naming the address and what to check."""

from __future__ import annotations

import time
from typing import Any

from areal_watchdog.common.errors import UserError

ENDED = ("SUCCEEDED", "FAILED", "STOPPED")
STOP_CODES = {"SUCCEEDED": 0, "STOPPED": -15}  # anything else ended badly: 1


CONNECT_PATIENCE_S = 30.0  # how long a Jobs API that refuses the client is asked again
SUBMIT_PATIENCE_S = 90.0  # how long a head whose job agent is not up yet is asked again
# What a head busy or starting answers (CI, a loaded machine): asked again. "try again later":
# no job agent took the job; a connection closed without an answer may have taken it.
TRANSIENT = ("try again later", "Connection aborted", "RemoteDisconnected", "Connection refused")


class RayJobs:
    """One cluster's Jobs API (its dashboard's URL)."""

    def __init__(self, address: str, patience: float = 0.0) -> None:
        """Connect, asking again for ``patience`` seconds (the launcher's submit): a head busy
        starting (CI: its dashboard answered once, then refused the client) is waited for, not
        failed. ``status`` and ``cancel`` ask once: a cluster that is gone is said at once."""
        self.address = address
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError as exc:
            raise UserError(f"the ray backend needs Ray installed here: {exc}") from None
        deadline = time.monotonic() + patience
        while True:
            try:
                self.client = JobSubmissionClient(address)
                return
            except Exception as exc:  # noqa: BLE001 - Ray raises bare ConnectionError, RuntimeError
                if time.monotonic() >= deadline:
                    raise UserError(
                        f"cannot reach Ray's Jobs API at {address} ({type(exc).__name__}: {exc}); "
                        "is the dashboard up (ray start --head --include-dashboard true)?"
                    ) from None
                time.sleep(1.0)

    def submit(
        self, entrypoint: str, submission_id: str, env: dict[str, str], patience: float = 0.0
    ) -> str:
        """Submit, asking again for ``patience`` seconds while the head is busy or starting
        (``TRANSIENT``, both seen in CI). The same submission id is sent again: a head that
        took the job before the connection closed says it already exists, and it is ours."""
        deadline, resent = time.monotonic() + patience, False
        while True:
            try:
                return self.client.submit_job(
                    entrypoint=entrypoint, submission_id=submission_id,
                    runtime_env={"env_vars": env},
                )  # fmt: skip
            except Exception as exc:  # noqa: BLE001
                said = str(exc)
                if resent and "already exists" in said:
                    return submission_id
                if not any(t in said for t in TRANSIENT) or time.monotonic() >= deadline:
                    raise UserError(f"Ray refused the job at {self.address}: {exc}") from None
                resent = True
                time.sleep(2.0)

    def status(self, submission_id: str) -> str:
        """``PENDING``, ``RUNNING``, ``SUCCEEDED``, ``FAILED`` or ``STOPPED``; ``UNKNOWN`` while
        the API does not answer (a restarting dashboard: asked again at the next poll)."""
        try:
            return str(self.client.get_job_status(submission_id).value)
        except Exception:  # noqa: BLE001
            return "UNKNOWN"

    def stop(self, submission_id: str) -> bool:
        """SIGTERM to the driver's process group, SIGKILL 3 s later (Ray's own stop)."""
        try:
            return bool(self.client.stop_job(submission_id))
        except Exception:  # noqa: BLE001 - an ended job or a gone API: nothing left to stop
            return False

    def info(self, submission_id: str) -> dict[str, Any]:
        try:
            details = self.client.get_job_info(submission_id)
        except Exception:  # noqa: BLE001
            return {}
        return {"message": details.message or "", "driver_exit_code": details.driver_exit_code}


def job_returncode(state: str, info: dict[str, Any]) -> int:
    """The driver's exit code as the job's end says it."""
    code = info.get("driver_exit_code")
    if isinstance(code, int):
        return code
    return STOP_CODES.get(state, 1)
