"""What a sink is: the keys it accepts, the message it makes of a report (and of a follow-up),
the request that carries a message, and how it reads the receiver's answer.

Everything else is common and no sink re-implements it (``notify/delivery.py``,
``notify/notifier.py``): the spool, retries with backoff, delivery ids stable across retries,
redaction, the ledger of delivered ids, threads. A message is built once, scrubbed and spooled
without secrets; ``request`` adds what each attempt needs (a fresh signature, a routing key),
so a message sent from the spool an hour later is signed then.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from areal_watchdog.common.secrets.redact import Redactor
from areal_watchdog.config.sinks import ResolvedSink, SinkSpec
from areal_watchdog.notify.digest import recovery_line


@dataclass(frozen=True)
class Option:
    """One key of a sink's own: its default and what it means (docs/notifications.md)."""

    default: Any
    doc: str
    kind: type = str


@dataclass(frozen=True)
class Keys:
    """The keys a sink accepts beyond the common ones (``type``, ``name``, ``timeout``,
    ``max_attempts``, ``backoff``)."""

    secrets: dict[str, str]  # field -> what it holds; given as <field>_env or <field>_file
    required: tuple[tuple[str, ...], ...] = ()  # one secret of each group must be given
    options: dict[str, Option] = field(default_factory=dict)


@dataclass(frozen=True)
class Request:
    """One attempt's POST."""

    url: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    """What a receiver's 2xx answer meant (some refuse with 200 and an error code)."""

    delivered: bool
    error: str = ""
    retryable: bool = True
    thread: dict[str, str] | None = None  # a post that starts a thread: where it is


class Sink:
    """A receiver type. Subclasses set ``type`` and ``keys`` and build ``report``; the rest has
    defaults a plain JSON webhook needs."""

    type: ClassVar[str] = ""
    keys: ClassVar[Keys] = Keys({"url": "the URL to POST to"}, (("url",),))
    pace: ClassVar[float] = 0.0  # seconds between two messages to one endpoint (its rate limit)
    resolves: ClassVar[bool] = False  # keeps incidents open until told (``resolution``)

    def __init__(self, spec: SinkSpec) -> None:
        self.spec = spec

    @property
    def threads(self) -> bool:
        """Whether follow-ups (pictures, recovery notices) reply in the report's thread."""
        return False

    def option(self, name: str) -> Any:
        return self.spec.options.get(name, self.keys.options[name].default)

    def problem(self) -> tuple[str, str] | None:
        """A combination of keys that cannot work: ``(key, why)``."""
        return None

    def endpoint(self, values: dict[str, str]) -> str:
        """Where requests go (``doctor`` opens a connection there)."""
        return values["url"]

    def report(self, report: dict[str, Any]) -> dict[str, Any]:
        """The message for a posted report, inside the vendor's limits."""
        raise NotImplementedError

    def note(self, text: str, thread: dict[str, str] | None) -> dict[str, Any] | None:
        """A short follow-up message (None: this sink takes none)."""
        return None

    def recovery(
        self, report: dict[str, Any], recovery: dict[str, Any], thread: dict[str, str] | None
    ) -> dict[str, Any] | None:
        """What ``on_hang: resume`` decided about the incident."""
        return self.note(recovery_line(report, recovery), thread)

    def resolution(self, report: dict[str, Any], reason: str) -> dict[str, Any] | None:
        """The incident is over (progress resumed, the job ended well): None unless the
        receiver keeps incidents open (PagerDuty)."""
        return None

    def upload(
        self, sink: ResolvedSink, thread: dict[str, str], png: Path, title: str, redactor: Redactor
    ) -> str:
        """Put an incident's picture into the thread its report started (``threads`` sinks);
        what happened, in a few words."""
        return "this sink takes no pictures"

    def request(self, values: dict[str, str], body: bytes, message_id: str, now: float) -> Request:
        """The attempt's request: signed now, secrets added now."""
        return Request(self.endpoint(values), body)

    def answer(self, text: str) -> Answer:
        """A 2xx answer's body, read."""
        return Answer(True)


def coded_answer(
    text: str, vendor: str, codes: tuple[str, ...], messages: tuple[str, ...], too_fast: int
) -> Answer:
    """A chat robot's 200 that carries a code (Feishu, DingTalk): 0 is a delivery, ``too_fast``
    is retried, any other code is refused with the vendor's message. ``codes`` and
    ``messages``: the keys that may hold them, the first found wins."""
    try:
        answer = json.loads(text)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return Answer(False, f"{vendor}: the answer is not JSON", retryable=False)
    code = next((answer[k] for k in codes if k in answer), None)
    if code == 0:
        return Answer(True)
    message = str(next((answer[k] for k in messages if answer.get(k)), ""))[:200]
    return Answer(False, f"{vendor}: {codes[0]} {code}: {message}", retryable=code == too_fast)
