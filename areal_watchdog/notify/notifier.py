"""Hand reports to every configured sink from a background thread, so sending never blocks
detection or evidence gathering; what cannot be delivered goes to the spool.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_watchdog.common.secrets.redact import Redactor
from areal_watchdog.config.sinks import (
    SinkSpec,
    secret_values,
)
from areal_watchdog.notify.delivery import Outcome, deliver, delivery_id, flush
from areal_watchdog.notify.envelope import encode
from areal_watchdog.notify.follow_ups import send_follow_up
from areal_watchdog.notify.open_incidents import RESOLVED, OpenIncidents
from areal_watchdog.notify.sinks.registry import UnknownSink, installed, sink_for
from areal_watchdog.notify.spool import Spool


def render(spec: SinkSpec, report: dict[str, Any]) -> bytes:
    """The body a sink receives for a report."""
    return encode(sink_for(spec).report(report))


@dataclass(frozen=True)
class Picture:
    """An incident's timeline, drawn after its report was posted: it goes into the threads
    that report started (sinks that thread: Slack with a bot token)."""

    incident_id: str
    path: Path
    title: str


@dataclass(frozen=True)
class Resolution:
    """An incident is over: sinks that keep incidents open (PagerDuty) resolve it."""

    report: dict[str, Any]
    reason: str


class Notifier:
    """Queue reports (and their pictures, and resolutions); a worker thread renders, sends and
    spools them."""

    def __init__(
        self,
        specs: list[SinkSpec],
        spool_dir: Path,
        redactor: Redactor,
        log: Callable[[str], None],
        spool_retry_interval: float = 30.0,
        say: Callable[[str], None] | None = None,
        incidents_dir: Path | None = None,
    ) -> None:
        self.specs = specs
        self.threading = [s for s in specs if _asks(s, "threads")]
        self.resolving = [s for s in specs if _asks(s, "resolves")]
        self.say = say or log  # failures are said where the user looks, not only logged
        self.spool = Spool(spool_dir, warn=self.say)
        self.redactor = redactor.with_values(secret_values(specs))
        self.log = log
        self.spool_retry_interval = spool_retry_interval
        self.open = OpenIncidents(incidents_dir if self.resolving else None, self._resolved)
        self.queue: queue.Queue[dict[str, Any] | Picture | Resolution | None]
        self.queue = queue.Queue(maxsize=100)
        self.last_flush = time.monotonic()
        self.deliveries: Counter[tuple[str, str]] = Counter()  # (sink, outcome): the metrics
        self.spool_depth = 0  # notifications waiting for a retry, after the last send or flush
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
            return
        if self.resolving:
            self.open.posted(report)

    def progressed(self, progress_at: float | None, step: int | None) -> None:
        """A step at ``progress_at``: the hangs posted before it are over."""
        if self.resolving:
            for report in self.open.moved_after(progress_at):
                self._queue(Resolution(report, f"progress resumed (step {step})"))

    def ended_well(self) -> None:
        """The job completed: every incident still open is over."""
        if self.resolving:
            for report in self.open.all():
                self._queue(Resolution(report, "the job completed"))

    def _queue(self, item: Resolution) -> None:
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            self.log(f"notification queue full: {item.report['incident_id']} not resolved")

    def submit_picture(self, picture: Picture) -> None:
        """Queue a drawn timeline for the threads its report started; returns at once."""
        if self.threading:
            try:
                self.queue.put_nowait(picture)
            except queue.Full:
                self.log(f"notification queue full: {picture.path} not uploaded")

    def close(self, timeout: float) -> list[Picture]:
        """Finish what is queued within ``timeout``. What is left is handed on: its reports
        and resolutions to the spool (a message being sent is there already: every delivery
        is written ahead), its pictures returned for whoever uploads them later."""
        if not self.thread.is_alive():
            return []
        with contextlib.suppress(queue.Full):
            self.queue.put(None, timeout=max(0.0, timeout))
        self.thread.join(timeout)
        if not self.thread.is_alive():
            return []
        pictures = []
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return pictures
            if isinstance(item, Picture):
                pictures.append(item)
            elif isinstance(item, Resolution):
                self._guarded(self._resolve, item, False)
            elif item is not None:
                self._guarded(self._deliver, item, False)

    def unsent(self) -> int:
        """Notifications in the spool, not delivered yet (written ahead or failed)."""
        return len(self.spool.pending()) if self.specs else 0

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
            elif isinstance(item, Resolution):
                self._guarded(self._resolve, item)
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
            self.spool_depth = len(self.spool.pending())

    def _deliver(self, report: dict[str, Any], send: bool = True) -> None:
        """Send a report to every sink (or, not ``send``, only spool it for a later flush)."""
        done = self.spool.delivered_ids()
        for kind, sink in installed(self.specs, self.log):
            message_id = delivery_id(report["incident_id"], sink.spec)
            if message_id in done:
                continue
            body = encode(kind.report(report))
            if not send:
                self.spool.keep(message_id, sink.spec, body, "not sent yet")
                continue
            outcome = deliver(sink, body, message_id, self.redactor, self.spool)
            self.log(f"notify {sink.spec.name}: {outcome.describe()}")
            self._count(sink.spec.name, outcome)
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

    def _count(self, sink: str, outcome: Outcome) -> None:
        kind = "refused" if not outcome.delivered and not outcome.retryable else "spooled"
        self.deliveries[(sink, "delivered" if outcome.delivered else kind)] += 1
        if not outcome.delivered:
            self.spool_depth = len(self.spool.pending())

    def _resolve(self, item: Resolution, send: bool = True) -> None:
        incident = item.report["incident_id"]
        if send:
            self.say(f"incident {incident} is over ({item.reason}): resolving it")
        send_follow_up(self.resolving, self.spool.directory, incident, RESOLVED,
                       lambda sink, _thread: sink.resolution(item.report, item.reason),
                       self.log, "resolution", send=send)  # fmt: skip

    def _resolved(self, incidents: list[str]) -> set[str]:
        """Those of ``incidents`` every resolving sink has resolved (the ledger says)."""
        done = self.spool.delivered_ids()
        return {
            incident
            for incident in incidents
            if all(delivery_id(f"{incident}|{RESOLVED}", s) in done for s in self.resolving)
        }

    def _upload(self, picture: Picture) -> None:
        upload_picture(self.threading, self.spool, picture, self.redactor, self.log)


def upload_picture(
    specs: list[SinkSpec],
    spool: Spool,
    picture: Picture,
    redactor: Redactor,
    log: Callable[[str], None],
) -> None:
    """Into each thread the incident's report started (the ledger has its first post)."""
    for kind, sink in installed([s for s in specs if _asks(s, "threads")], log):
        thread = spool.thread_of(delivery_id(picture.incident_id, sink.spec))
        if thread is None:
            log(f"timeline to {sink.spec.name}: no thread (the report is not posted)")
            continue
        said = kind.upload(sink, thread, picture.path, picture.title, redactor)
        log(f"timeline to {sink.spec.name}: {said}")


def deliver_spooled(spool_dir: Path, log: Callable[[str], None]) -> tuple[int, int]:
    """Retry a run's spooled notifications now (any ``areal-launch`` command touching the run)."""
    spool = Spool(spool_dir, warn=log)
    if not spool.pending():
        return 0, 0
    return flush(spool, Redactor.from_environment(), log=log)


def _asks(spec: SinkSpec, capability: str) -> bool:
    """Whether the sink (when installed here) has ``capability``."""
    try:
        return bool(getattr(sink_for(spec), capability))
    except UnknownSink:
        return False
