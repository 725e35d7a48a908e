"""Hand reports to every configured sink from a background thread, so sending never blocks
detection or evidence gathering; what cannot be delivered goes to the spool.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_watchdog.common.redact import Redactor
from areal_watchdog.config.sinks import (
    ResolvedSink,
    SecretError,
    SinkSpec,
    resolve,
    secret_values,
)
from areal_watchdog.notify.delivery import deliver, delivery_id, flush
from areal_watchdog.notify.envelope import build_envelope, encode
from areal_watchdog.notify.slack import build_slack_message
from areal_watchdog.notify.slack_upload import upload_picture
from areal_watchdog.notify.spool import Spool


def render(sink: SinkSpec, report: dict[str, Any]) -> bytes:
    """The body a sink receives for a report."""
    if sink.type == "slack":
        message = build_slack_message(report)
        return encode({**message, "channel": sink.channel} if sink.channel else message)
    return encode(build_envelope(report))


def resolve_all(specs: list[SinkSpec], log: Callable[[str], None]) -> list[ResolvedSink]:
    """Every sink whose URL and secret can be read now; the others are logged (no values)."""
    resolved = []
    for spec in specs:
        try:
            resolved.append(resolve(spec))
        except SecretError as exc:
            log(str(exc))
    return resolved


@dataclass(frozen=True)
class Picture:
    """An incident's timeline, drawn after its report was posted: it goes into the threads
    that report started (Slack with a bot token)."""

    incident_id: str
    path: Path
    title: str


class Notifier:
    """Queue reports (and their pictures); a worker thread renders, sends and spools them."""

    def __init__(
        self,
        specs: list[SinkSpec],
        spool_dir: Path,
        redactor: Redactor,
        log: Callable[[str], None],
        spool_retry_interval: float = 30.0,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.specs = specs
        self.say = say or log  # failures are said where the user looks, not only logged
        self.spool = Spool(spool_dir, warn=self.say)
        self.redactor = redactor.with_values(secret_values(specs))
        self.log = log
        self.spool_retry_interval = spool_retry_interval
        self.queue: queue.Queue[dict[str, Any] | Picture | None] = queue.Queue(maxsize=100)
        self.last_flush = time.monotonic()
        self.thread = threading.Thread(target=self._work, name="areal-watchdog-notify", daemon=True)
        if specs:
            self.thread.start()

    def submit(self, report: dict[str, Any]) -> None:
        """Queue a report for every sink; returns at once. The report comes scrubbed (the
        incident desk redacts it once, for the files and the notifications alike)."""
        if not self.specs:
            return
        try:
            self.queue.put_nowait(report)
        except queue.Full:
            self.log("notification queue full: report kept on disk only")

    def submit_picture(self, picture: Picture) -> None:
        """Queue a drawn timeline for the threads its report started; returns at once."""
        if any(spec.threads for spec in self.specs):
            try:
                self.queue.put_nowait(picture)
            except queue.Full:
                self.log(f"notification queue full: {picture.path} not uploaded")

    def close(self, timeout: float) -> None:
        """Finish what is queued within ``timeout``; anything left stays in the spool."""
        if not self.thread.is_alive():
            return
        self.queue.put(None)
        self.thread.join(timeout)

    def _work(self) -> None:
        while True:
            wait = max(0.1, self.spool_retry_interval - (time.monotonic() - self.last_flush))
            try:
                item = self.queue.get(timeout=wait)
            except queue.Empty:
                self._guarded(self._flush_spool)
                continue
            if item is None:
                return
            if isinstance(item, Picture):
                self._guarded(self._upload, item)
            else:
                self._guarded(self._deliver, item)

    def _guarded(self, work: Callable[..., None], *args: Any) -> None:
        """Run one piece of work; an error is said and the thread keeps serving (a dead
        notifier thread would lose every later report without a word)."""
        try:
            work(*args)
        except Exception as exc:  # noqa: BLE001 - said, then the next report is served
            self.say(f"notifier error ({type(exc).__name__}: {exc}); still running")

    def _flush_spool(self) -> None:
        self.last_flush = time.monotonic()
        if self.spool.pending():
            flush(self.spool, self.redactor, log=self.log, say=self.say)

    def _deliver(self, report: dict[str, Any]) -> None:
        done = self.spool.delivered_ids()
        for sink in resolve_all(self.specs, self.log):
            message_id = delivery_id(report["incident_id"], sink.spec)
            if message_id in done:
                continue
            body = render(sink.spec, report)
            outcome = deliver(sink, body, message_id, self.redactor, self.spool)
            self.log(f"notify {sink.spec.name}: {outcome.describe()}")
            if outcome.delivered:
                continue
            if outcome.retryable:
                self.say(
                    f"notification to {sink.spec.name} failed ({outcome.describe()}); kept in "
                    f"{self.spool.directory} and retried every {self.spool_retry_interval:g} s"
                )
            else:
                self.say(
                    f"notification to {sink.spec.name} refused by the receiver "
                    f"({outcome.error}); not retried"
                )

    def _upload(self, picture: Picture) -> None:
        """Into each thread the incident's report started (the ledger has its first post)."""
        for sink in resolve_all([s for s in self.specs if s.threads], self.log):
            thread = self.spool.thread_of(delivery_id(picture.incident_id, sink.spec))
            if thread is None:
                self.log(f"timeline to {sink.spec.name}: no thread (the report is not posted)")
                continue
            said = upload_picture(sink, thread, picture.path, picture.title, self.redactor)
            self.log(f"timeline to {sink.spec.name}: {said}")


def deliver_spooled(spool_dir: Path, log: Callable[[str], None]) -> tuple[int, int]:
    """Retry a run's spooled notifications now (any ``areal-launch`` command touching the run)."""
    spool = Spool(spool_dir, warn=log)
    if not spool.pending():
        return 0, 0
    return flush(spool, Redactor.from_environment(), log=log)
