"""Notification sinks from ``watchdog.notify``: which receiver, and where its secrets live.

Secrets never sit in the config: a sink names an environment variable (``*_env``) or a file
(``*_file``, refused when group or others may read it). A ``SinkSpec`` holds only those names and
is safe to write to disk; ``resolve`` reads the values when a request is about to be sent.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from areal_watchdog.common.plain_record import PlainRecord
from areal_watchdog.config.checks import Checker, default

SINK_TYPES = ("slack", "webhook")
_SECRET_FIELDS = {"slack": ("webhook_url", "token"), "webhook": ("url", "secret")}
_REQUIRED = {"slack": ("webhook_url",), "webhook": ("url",)}  # a Slack token stands for its URL
SLACK_API = "https://slack.com/api/chat.postMessage"  # where a bot token posts (and threads)


@dataclass(frozen=True)
class SinkSpec(PlainRecord):
    """One receiver; names of where its URL and secret come from, never the values."""

    type: str
    name: str
    sources: dict[str, dict[str, str]]  # field -> {"env": NAME} or {"file": PATH}
    timeout: float = 10.0
    max_attempts: int = 5
    backoff: float = 1.0
    channel: str | None = None  # Slack with a bot token: where it posts
    api_url: str = SLACK_API

    @property
    def threads(self) -> bool:
        """A Slack bot token: follow-ups reply in the incident's thread."""
        return self.type == "slack" and "token" in self.sources

    @property
    def key(self) -> str:
        """A stable, secret-free identity (used in delivery ids and the spool)."""
        return self.name


@dataclass(frozen=True)
class ResolvedSink:
    """A sink with its URL (and signing secret) read from the environment or a file."""

    spec: SinkSpec
    url: str
    secret: str | None = None
    token: str | None = None  # a Slack bot token

    def secret_values(self) -> list[str]:
        """Everything to redact: the URL, its path and query (tokens live there), the secret
        and the token (a bot token's URL is Slack's public API: not a secret)."""
        if self.token:
            return [self.token]
        parts = urlsplit(self.url)
        return [v for v in (self.url, parts.path, parts.query, self.secret) if v and v != "/"]


MAX_ATTEMPTS = 100


def parse_sinks(items: list[dict[str, Any]], source: str) -> list[SinkSpec]:
    """Validate ``watchdog.notify``; raise ConfigError naming the entry and key."""
    check = Checker(source)
    specs = [_parse_sink(check, item, f"watchdog.notify[{i}]", i) for i, item in enumerate(items)]
    if len({s.name for s in specs}) != len(specs):
        raise check.fail("watchdog.notify", "sink names must be unique")
    return specs


def _parse_sink(check: Checker, item: dict[str, Any], where: str, index: int) -> SinkSpec:
    kind = item.get("type")
    if kind not in SINK_TYPES:
        raise check.fail(f"{where}.type", f"must be one of {', '.join(SINK_TYPES)}; got {kind!r}")
    for field in _SECRET_FIELDS[kind]:
        if field in item:
            raise check.fail(
                f"{where}.{field}",
                f"secrets never sit in the config: "
                f"use {field}_env (a variable name) or {field}_file (a path)",
            )
    known = {"type", "name", "timeout", "max_attempts", "backoff"}
    known |= {f"{f}_{how}" for f in _SECRET_FIELDS[kind] for how in ("env", "file")}
    known |= {"channel", "api_url"} if kind == "slack" else set()
    check.known_keys(item, where, known)
    sources = _sources(check, item, where, kind)
    channel = check.optional_text(item, f"{where}.channel", None) if kind == "slack" else None
    if "token" in sources and "webhook_url" in sources:
        raise check.fail(f"{where}.token_env", "give a token or a webhook_url, not both")
    if "token" in sources and not channel:
        raise check.fail(f"{where}.channel", "is missing: a bot token posts to a channel (C0123)")
    return SinkSpec(
        kind,
        check.text(item, f"{where}.name", default=f"{kind}-{index}") or f"{kind}-{index}",
        sources,
        check.number(item, f"{where}.timeout", default(SinkSpec, "timeout"), minimum=1e-9),
        check.integer(
            item, f"{where}.max_attempts", default(SinkSpec, "max_attempts"), 1, MAX_ATTEMPTS
        ),
        check.number(item, f"{where}.backoff", default(SinkSpec, "backoff"), minimum=0.0),
        channel,
        check.text(item, f"{where}.api_url", default=SLACK_API) or SLACK_API,
    )


def _sources(check: Checker, item: dict[str, Any], where: str, kind: str) -> dict[str, dict]:
    """Where each secret field is read from: ``{field: {"env": NAME} | {"file": PATH}}``."""
    sources: dict[str, dict[str, str]] = {}
    for field in _SECRET_FIELDS[kind]:
        env, path = item.get(f"{field}_env"), item.get(f"{field}_file")
        if env and path:
            raise check.fail(f"{where}.{field}_env", f"give {field}_env or {field}_file, not both")
        if env:
            sources[field] = {"env": str(env)}
        elif path:
            sources[field] = {"file": os.path.expanduser(str(path))}
        elif field in _REQUIRED[kind] and not _has_token(item):
            raise check.fail(
                f"{where}.{field}_env",
                f"is missing: name the variable "
                f"(or {field}_file) that holds the {field.replace('_', ' ')}",
            )
    return sources


def _has_token(item: dict[str, Any]) -> bool:
    return bool(item.get("token_env") or item.get("token_file"))


class SecretError(Exception):
    """A sink's URL or secret could not be read; the message never holds a secret value."""


def resolve(spec: SinkSpec, env: dict[str, str] | None = None) -> ResolvedSink:
    """Read the sink's URL and secret now."""
    env = dict(os.environ) if env is None else env
    values: dict[str, str] = {}
    for field, src in spec.sources.items():
        if "env" in src:
            value = env.get(src["env"], "")
            if not value:
                raise SecretError(
                    f"sink {spec.name}: environment variable {src['env']} ({field}) is not set"
                )
        else:
            value = _read_secret_file(src["file"], spec.name, field)
        values[field] = value.strip()
    token = values.get("token")
    url = spec.api_url if token else values.get("webhook_url") or values.get("url") or ""
    secret = values.get("secret")
    if secret:
        try:
            secret_key(secret)
        except ValueError as exc:
            raise SecretError(f"{spec.name}: {exc}") from None
    return ResolvedSink(spec, url, secret, token)


def secret_values(specs: list[SinkSpec]) -> list[str]:
    """The sinks' URLs and secrets, for redaction and masking (sinks that cannot be read now
    are left out)."""
    values: list[str] = []
    for spec in specs:
        try:
            values += resolve(spec).secret_values()
        except SecretError:
            continue
    return values


def _read_secret_file(path: str, name: str, field: str) -> str:
    try:
        info = os.stat(path)
    except OSError as exc:
        raise SecretError(f"sink {name}: cannot read {field} file {path}: {exc.strerror}") from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretError(
            f"sink {name}: {field} file {path} is readable by others "
            f"(mode {stat.filemode(info.st_mode)}); run chmod 600 {path}"
        )
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def secret_key(secret: str) -> bytes:
    """The HMAC key: a Standard Webhooks ``whsec_`` secret is base64; anything else is text."""
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret[len("whsec_") :], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("a whsec_ secret must be base64 after 'whsec_'") from None
    return secret.encode("utf-8")
