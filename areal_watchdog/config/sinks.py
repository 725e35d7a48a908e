"""Notification sinks from ``watchdog.notify``, in the shape every sink shares: its type and
name, where its secrets live, how hard to try. What each type accepts beyond that (its secret
fields, its options) the sink declares itself (``notify/sinks/``), and its registry checks it.

Secrets never sit in the config: a sink names an environment variable (``<field>_env``) or a
file (``<field>_file``, refused when group or others may read it). A ``SinkSpec`` holds only
those names and is safe to write to disk; ``resolve`` reads the values when a request is about
to be sent.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from areal_watchdog.common.json_dataclass import PlainRecord
from areal_watchdog.config.reading.checks import Checker, default

COMMON_KEYS = ("type", "name", "timeout", "max_attempts", "backoff")
SOURCE_SUFFIXES = ("_env", "_file")
MAX_ATTEMPTS = 100


@dataclass(frozen=True)
class SinkSpec(PlainRecord):
    """One receiver: names of where its secrets come from (never the values), its options."""

    type: str
    name: str
    sources: dict[str, dict[str, str]]  # field -> {"env": NAME} or {"file": PATH}
    options: dict[str, Any] = field(default_factory=dict)  # what the sink's own keys say
    timeout: float = 10.0
    max_attempts: int = 5
    backoff: float = 1.0

    @property
    def key(self) -> str:
        """A stable, secret-free identity (used in delivery ids and the spool)."""
        return self.name


@dataclass(frozen=True)
class ResolvedSink:
    """A sink with its secrets (URL, token, signing secret, routing key) read now."""

    spec: SinkSpec
    values: dict[str, str]

    def secret_values(self) -> list[str]:
        """Everything to redact: each value, and a URL's path and query (tokens live there)."""
        found: list[str] = []
        for value in self.values.values():
            found.append(value)
            parts = urlsplit(value)
            if parts.scheme in ("http", "https"):
                found += [v for v in (parts.path, parts.query) if v and v != "/"]
        return found


def parse_sinks(items: list[dict[str, Any]], source: str) -> list[SinkSpec]:
    """The shape every sink shares, checked; raise ConfigError naming the entry and key. The
    sink's own keys are checked by its registry (``notify.sinks.registry.checked``)."""
    check = Checker(source)
    specs = [_parse_sink(check, item, f"watchdog.notify[{i}]", i) for i, item in enumerate(items)]
    if len({s.name for s in specs}) != len(specs):
        raise check.fail("watchdog.notify", "sink names must be unique")
    return specs


def _parse_sink(check: Checker, item: dict[str, Any], where: str, index: int) -> SinkSpec:
    kind = item.get("type")
    if not isinstance(kind, str) or not kind:
        raise check.fail(f"{where}.type", f"is missing: name the sink's type; got {kind!r}")
    return SinkSpec(
        kind,
        check.text(item, f"{where}.name", default=f"{kind}-{index}") or f"{kind}-{index}",
        _sources(check, item, where),
        {k: v for k, v in item.items() if k not in COMMON_KEYS and not _is_source(k)},
        check.number(item, f"{where}.timeout", default(SinkSpec, "timeout"), minimum=1e-9),
        check.integer(
            item, f"{where}.max_attempts", default(SinkSpec, "max_attempts"), 1, MAX_ATTEMPTS
        ),
        check.number(item, f"{where}.backoff", default(SinkSpec, "backoff"), minimum=0.0),
    )


def _is_source(key: str) -> bool:
    return key.endswith(SOURCE_SUFFIXES)


def _sources(check: Checker, item: dict[str, Any], where: str) -> dict[str, dict[str, str]]:
    """Where each secret field is read from: ``{field: {"env": NAME} | {"file": PATH}}``."""
    sources: dict[str, dict[str, str]] = {}
    for key in sorted(k for k in item if _is_source(k)):
        name, _, how = key.rpartition("_")
        value = item[key]
        if not isinstance(value, str) or not value:
            what = "a variable" if how == "env" else "a file"
            raise check.fail(f"{where}.{key}", f"must name {what}")
        if name in sources:
            raise check.fail(f"{where}.{name}_env", f"give {name}_env or {name}_file, not both")
        sources[name] = {"env": value} if how == "env" else {"file": os.path.expanduser(value)}
    return sources


class SecretError(Exception):
    """A sink's URL or secret could not be read; the message never holds a secret value."""


def resolve(spec: SinkSpec, env: dict[str, str] | None = None) -> ResolvedSink:
    """Read the sink's secrets now."""
    env = dict(os.environ) if env is None else env
    values: dict[str, str] = {}
    for name, src in spec.sources.items():
        if "env" in src:
            value = env.get(src["env"], "")
            if not value:
                raise SecretError(
                    f"sink {spec.name}: environment variable {src['env']} ({name}) is not set"
                )
        else:
            value = _read_secret_file(src["file"], spec.name, name)
        values[name] = value.strip()
    if values.get("secret"):
        try:
            secret_key(values["secret"])
        except ValueError as exc:
            raise SecretError(f"{spec.name}: {exc}") from None
    return ResolvedSink(spec, values)


def secret_values(specs: list[SinkSpec]) -> list[str]:
    """The sinks' secrets, for redaction and masking (sinks that cannot be read now are left
    out)."""
    values: list[str] = []
    for spec in specs:
        try:
            values += resolve(spec).secret_values()
        except SecretError:
            continue
    return values


def _read_secret_file(path: str, name: str, field_name: str) -> str:
    try:
        info = os.stat(path)
    except OSError as exc:
        raise SecretError(
            f"sink {name}: cannot read {field_name} file {path}: {exc.strerror}"
        ) from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretError(
            f"sink {name}: {field_name} file {path} is readable by others "
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
