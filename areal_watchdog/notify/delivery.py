"""Deliver one message to one sink: bounded timeouts, retries with backoff and jitter, a spool.

Retried: connection errors, timeouts, HTTP 408, 429 (after ``Retry-After``) and 5xx. Not
retried: any other 4xx, logged with the (scrubbed) response body. A delivery that still fails is
written to the run's spool and retried later; a delivery id, stable across every retry, lets
receivers deduplicate, and delivered ids are remembered so nothing is sent twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import requests

from areal_watchdog.common.secrets.redact import Redactor
from areal_watchdog.config.sinks import ResolvedSink, SecretError, SinkSpec, resolve
from areal_watchdog.notify.sinks.deadline_post import post_within
from areal_watchdog.notify.sinks.registry import sink_for
from areal_watchdog.notify.spool import Spool

MAX_RETRY_AFTER = 120.0  # seconds: a longer Retry-After goes to the spool instead
MAX_BACKOFF = 30.0


@dataclass
class Outcome:
    """What happened to one delivery."""

    delivered: bool
    attempts: int
    status: int | None = None
    error: str = ""
    retryable: bool = True
    seconds: float = 0.0
    thread: dict[str, str] | None = None  # a post that starts a thread (Slack with a token)

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
    """At most one message per interval per endpoint (the receiver's rate limit), shared by
    every sender thread."""

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
    """POST ``body`` until it is delivered, refused, or the attempts run out; each attempt is
    made (signed, keyed) by the sink."""
    spec = sink.spec
    kind = sink_for(spec)
    started = time.monotonic()
    outcome = Outcome(False, 0)
    for attempt in range(1, spec.max_attempts + 1):
        outcome.attempts = attempt
        if kind.pace:
            PACER.wait(f"{spec.type}|{kind.endpoint(sink.values)}", kind.pace)
        request = kind.request(sink.values, body, message_id, time.time())
        headers = {"Content-Type": "application/json", "User-Agent": "areal-watchdog",
                   "webhook-id": message_id, **request.headers}  # fmt: skip
        wait = min(MAX_BACKOFF, spec.backoff * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
        try:
            response = post_within(spec.timeout, request.url, request.body, headers)
        except requests.RequestException as exc:
            outcome.error = redactor.scrub(f"{type(exc).__name__}: {exc}")[:300]
        else:
            outcome.status = response.status_code
            if 200 <= response.status_code < 300:
                answer = kind.answer(response.text)
                outcome.delivered, outcome.thread = answer.delivered, answer.thread
                if answer.delivered:
                    break
                outcome.error = redactor.scrub(answer.error)[:300]
                outcome.retryable = answer.retryable
                if not outcome.retryable:
                    break
            else:
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


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def deliver(
    sink: ResolvedSink, body: bytes, message_id: str, redactor: Redactor, spool: Spool
) -> Outcome:
    """Send one message and record the outcome: delivered ids go to the ledger, retryable
    failures stay spooled, refusals are dropped. Written ahead to the spool, so a process that
    dies mid-send leaves it for the next one; a full disk only loses that insurance."""
    with contextlib.suppress(OSError):
        if not spool.holds(message_id):
            spool.keep(message_id, sink.spec, body, "not sent yet")
    outcome = send(sink, body, message_id, redactor)
    with contextlib.suppress(OSError):
        if outcome.delivered:
            spool.mark_delivered(message_id, outcome.thread)
        elif outcome.retryable:
            spool.keep(message_id, sink.spec, body, outcome.error)
        else:
            spool.drop(message_id)
    return outcome


def flush(
    spool: Spool,
    redactor: Redactor,
    log: Callable[[str], None] = lambda _m: None,
    env: dict[str, str] | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[int, int]:
    """Retry every spooled delivery once (with its own retries); return (sent, left). Final
    outcomes (delivered, refused) go to ``say`` (default: ``log``), the rest to ``log``."""
    say = say or log
    done = spool.delivered_ids()
    sent = left = 0
    for entry, spec in spool.pending():
        message_id = entry["id"]
        if message_id in done:  # delivered, then the process died before tidying up
            with contextlib.suppress(OSError):
                spool.mark_delivered(message_id)
            continue
        try:
            sink = resolve(spec, env)
        except SecretError as exc:
            log(f"spool: {exc}")
            left += 1
            continue
        body = entry["body"].encode("utf-8")
        outcome = deliver(sink, body, message_id, redactor.with_values(sink.secret_values()), spool)
        sent += outcome.delivered
        left += not outcome.delivered and outcome.retryable
        if outcome.delivered or not outcome.retryable:
            say(f"spooled notification to {spec.name}: {outcome.describe()}")
    return sent, left
