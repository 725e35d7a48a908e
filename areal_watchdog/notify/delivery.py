"""Deliver one message to one sink: bounded timeouts, retries with backoff and jitter, a spool.

Retried: connection errors, timeouts, HTTP 408, 429 (after ``Retry-After``) and 5xx. Not
retried: any other 4xx, logged with the (scrubbed) response body. A delivery that still fails is
written to the run's spool and retried later; a delivery id, stable across every retry, lets
receivers deduplicate, and delivered ids are remembered so nothing is sent twice.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from areal_watchdog.common.atomic import open_append, read_json, write_json_atomic
from areal_watchdog.common.redact import Redactor
from areal_watchdog.notify.envelope import signature_headers
from areal_watchdog.notify.sinks import ResolvedSink, SecretError, SinkSpec, resolve

MAX_RETRY_AFTER = 120.0  # seconds: a longer Retry-After goes to the spool instead
MAX_BACKOFF = 30.0
SLACK_MIN_INTERVAL = 1.1  # seconds between two messages to one Slack webhook


@dataclass
class Outcome:
    """What happened to one delivery."""

    delivered: bool
    attempts: int
    status: int | None = None
    error: str = ""
    retryable: bool = True
    seconds: float = 0.0

    def describe(self) -> str:
        if self.delivered:
            return (
                f"delivered (HTTP {self.status}, {self.attempts} attempt(s), {self.seconds:.2f} s)"
            )
        kind = "retryable" if self.retryable else "refused: not retried"
        return f"failed after {self.attempts} attempt(s): {self.error} ({kind})"


def delivery_id(incident_id: str, sink: SinkSpec) -> str:
    """Stable across retries and processes: one id per (incident, sink)."""
    digest = hashlib.sha256(f"{incident_id}|{sink.key}".encode()).hexdigest()[:24]
    return f"msg_{digest}"


class _Pacer:
    """At most one message per interval per Slack webhook, shared by every sender thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next_at: dict[str, float] = {}

    def wait(self, key: str, interval: float) -> None:
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next_at.get(key, 0.0))
            self.next_at[key] = start + interval
        time.sleep(max(0.0, start - now))


PACER = _Pacer()


def send(
    sink: ResolvedSink,
    body: bytes,
    message_id: str,
    redactor: Redactor,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome:
    """POST ``body`` until it is delivered, refused, or the attempts run out."""
    spec = sink.spec
    started = time.monotonic()
    outcome = Outcome(False, 0)
    for attempt in range(1, spec.max_attempts + 1):
        outcome.attempts = attempt
        if spec.type == "slack":
            PACER.wait(sink.url, SLACK_MIN_INTERVAL)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "areal-watchdog",
            "webhook-id": message_id,
        }
        if spec.type == "webhook":
            timestamp = int(time.time())
            headers["webhook-timestamp"] = str(timestamp)
            if sink.secret:
                headers.update(signature_headers(body, sink.secret, message_id, timestamp))
        wait = min(MAX_BACKOFF, spec.backoff * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
        try:
            response = _post_within(spec.timeout, sink.url, body, headers)
        except requests.RequestException as exc:
            outcome.error = redactor.scrub(f"{type(exc).__name__}: {exc}")[:300]
        else:
            outcome.status = response.status_code
            if 200 <= response.status_code < 300:
                outcome.delivered = True
                break
            detail = redactor.scrub(response.text.strip().replace("\n", " "))[:300]
            outcome.error = f"HTTP {response.status_code}: {detail}"
            if response.status_code == 429:
                retry_after = _retry_after(response.headers.get("Retry-After"))
                if retry_after is not None:
                    if retry_after > MAX_RETRY_AFTER:
                        break
                    wait = retry_after + random.uniform(0.0, 0.25)  # never earlier than asked
            elif not (response.status_code == 408 or response.status_code >= 500):
                outcome.retryable = False
                break
        if attempt < spec.max_attempts:
            sleep(wait)
    outcome.seconds = time.monotonic() - started
    return outcome


GRACE = 1.0  # seconds past a sink's timeout before an attempt is abandoned


def _post_within(timeout: float, url: str, body: bytes, headers: dict[str, str]) -> Any:
    """POST with ``timeout`` as a total deadline: requests' own timeout is per read, so a
    receiver that trickles one byte at a time would hold it forever. On the deadline the
    connection is closed under the worker thread, which then ends too."""
    session = requests.Session()
    result: dict[str, Any] = {}

    def attempt() -> None:
        try:
            result["response"] = session.post(
                url, data=body, headers=headers, timeout=(min(5.0, timeout), timeout),
                allow_redirects=False,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - handed to the caller below
            result["error"] = exc

    worker = threading.Thread(target=attempt, name="areal-watchdog-post", daemon=True)
    worker.start()
    worker.join(timeout + GRACE)  # requests' own timeouts, with better messages, come first
    session.close()
    if worker.is_alive():
        raise requests.Timeout(f"no complete answer within {timeout:g} s")
    if "error" in result:
        error = result["error"]
        raise (
            error
            if isinstance(error, requests.RequestException)
            else requests.RequestException(str(error))
        )
    return result["response"]


def _ends_a_line(path: Path) -> bool:
    """True when ``path`` is missing, empty or ends with a newline."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            if fh.tell() == 0:
                return True
            fh.seek(-1, 2)
            return fh.read(1) == b"\n"
    except OSError:
        return True


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


class Spool:
    """Failed deliveries kept in ``<run_dir>/watchdog/spool`` until a later attempt succeeds."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.delivered_log = directory / "delivered.jsonl"
        self.lock = threading.Lock()

    def delivered_ids(self) -> set[str]:
        try:
            lines = self.delivered_log.read_text(encoding="utf-8").splitlines()
        except OSError:
            return set()
        ids = set()
        for line in lines:
            try:
                ids.add(json.loads(line)["id"])
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a crash or a full disk: the rest still counts
        return ids

    def mark_delivered(self, message_id: str) -> None:
        with self.lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            line = json.dumps({"id": message_id, "time": time.time()}) + "\n"
            if not _ends_a_line(self.delivered_log):
                line = "\n" + line  # after a line cut short, start a fresh one
            with open_append(self.delivered_log) as fh:
                fh.write(line)
            (self.directory / f"{message_id}.json").unlink(missing_ok=True)

    def drop(self, message_id: str) -> None:
        """Forget a delivery the receiver refused for good (a 4xx other than 408/429)."""
        (self.directory / f"{message_id}.json").unlink(missing_ok=True)

    def keep(self, message_id: str, spec: SinkSpec, body: bytes, error: str) -> None:
        """Store a failed delivery: the sink's secret-free spec and the (scrubbed) body."""
        with self.lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"{message_id}.json"
            previous = read_json(path) or {}
            write_json_atomic(
                path,
                {
                    "id": message_id,
                    "sink": spec.to_dict(),
                    "body": body.decode("utf-8"),
                    "created": previous.get("created", time.time()),
                    "last_error": error,
                    "tries": int(previous.get("tries", 0)) + 1,
                },
                fsync=True,
            )

    def pending(self) -> list[dict[str, Any]]:
        if not self.directory.is_dir():
            return []
        entries = []
        for path in sorted(self.directory.glob("msg_*.json")):
            entry = read_json(path)
            if isinstance(entry, dict) and "body" in entry:
                entries.append(entry)
        return entries

    def flush(
        self,
        redactor: Redactor,
        env: dict[str, str] | None = None,
        log: Callable[[str], None] = lambda _m: None,
    ) -> tuple[int, int]:
        """Retry every pending delivery once (with its own retries); return (sent, left)."""
        done = self.delivered_ids()
        sent = left = 0
        for entry in self.pending():
            message_id = entry["id"]
            if message_id in done:
                self.mark_delivered(message_id)
                continue
            spec = SinkSpec.from_dict(entry["sink"])
            try:
                sink = resolve(spec, env)
            except SecretError as exc:
                log(f"spool: {exc}")
                left += 1
                continue
            outcome = send(
                sink,
                entry["body"].encode("utf-8"),
                message_id,
                redactor.with_values(sink.secret_values()),
            )
            if outcome.delivered:
                self.mark_delivered(message_id)
                sent += 1
                log(f"spool: {message_id} to {spec.name} {outcome.describe()}")
            elif not outcome.retryable:
                self.drop(message_id)
                log(f"spool: {message_id} to {spec.name} dropped: {outcome.error}")
            else:
                self.keep(message_id, spec, entry["body"].encode("utf-8"), outcome.error)
                left += 1
        return sent, left
