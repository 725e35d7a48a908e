"""Every sink ``watchdog.notify`` may name: ours in ``SINKS``, another package's in the
``areal_watchdog.sinks`` entry points. A new sink is one module and one registration
(docs/architecture.md); nothing else names a sink type, everything asks the sink."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from areal_watchdog.common.plugins import load, registered
from areal_watchdog.config.reading.checks import Checker
from areal_watchdog.config.sinks import (
    COMMON_KEYS,
    SOURCE_SUFFIXES,
    ResolvedSink,
    SecretError,
    SinkSpec,
    parse_sinks,
    resolve,
)
from areal_watchdog.notify.sinks.base import Sink

ENTRY_POINTS = "areal_watchdog.sinks"
SINKS = {  # type -> "module:class"
    "slack": "areal_watchdog.notify.sinks.slack.sink:SlackSink",
    "webhook": "areal_watchdog.notify.sinks.webhook:WebhookSink",
    "feishu": "areal_watchdog.notify.sinks.feishu:FeishuSink",
    "dingtalk": "areal_watchdog.notify.sinks.dingtalk:DingTalkSink",
    "pagerduty": "areal_watchdog.notify.sinks.pagerduty:PagerDutySink",
    "teams": "areal_watchdog.notify.sinks.teams:TeamsSink",
}


class UnknownSink(LookupError):
    """No installed package registers this sink type."""


def sink_types() -> list[str]:
    """Ours, then the installed packages'."""
    return registered(SINKS, ENTRY_POINTS)


def sink_class(kind: str) -> type[Sink]:
    found = load(kind, SINKS, ENTRY_POINTS)
    if found is None:
        raise UnknownSink(f"no sink type {kind!r} (installed: {', '.join(sink_types())})")
    return found


def sink_for(spec: SinkSpec) -> Sink:
    """The sink that sends for ``spec``; raises UnknownSink."""
    return sink_class(spec.type)(spec)


def installed(specs: list[SinkSpec], log: Callable[[str], None]) -> list[tuple[Sink, ResolvedSink]]:
    """Every sink installed here whose secrets can be read now; the others are logged (no
    values)."""
    found = []
    for spec in specs:
        try:
            found.append((sink_for(spec), resolve(spec)))
        except UnknownSink as exc:
            log(f"sink {spec.name}: {exc}")
        except SecretError as exc:
            log(str(exc))
    return found


def parse(items: list[dict[str, Any]], source: str) -> list[SinkSpec]:
    """``watchdog.notify`` as written in a config, checked whole; raises ConfigError."""
    return checked([spec.to_dict() for spec in parse_sinks(items, source)], source)


def checked(notify: list[dict[str, Any]], source: str) -> list[SinkSpec]:
    """``watchdog.notify`` (as ``config.validate`` left it) checked by each sink's own
    declaration; raises ConfigError naming the entry and key."""
    check = Checker(source)
    specs = [SinkSpec.from_dict(item) for item in notify]
    for index, spec in enumerate(specs):
        _check_one(check, spec, f"watchdog.notify[{index}]")
    return specs


def _check_one(check: Checker, spec: SinkSpec, where: str) -> None:
    try:
        sink = sink_for(spec)
    except UnknownSink as exc:
        raise check.fail(f"{where}.type", str(exc)) from None
    keys = sink.keys
    for name in spec.options:
        if name in keys.secrets:
            raise check.fail(f"{where}.{name}", f"secrets never sit in the config: use "
                             f"{name}_env (a variable name) or {name}_file (a path)")  # fmt: skip
    known = {*COMMON_KEYS, *keys.options}
    known |= {f"{f}{suffix}" for f in keys.secrets for suffix in SOURCE_SUFFIXES}
    given = {*spec.options, *(f"{f}_{next(iter(src))}" for f, src in spec.sources.items())}
    check.known_keys({k: None for k in given}, where, known)
    for group in keys.required:
        if not any(f in spec.sources for f in group):
            first = group[0]
            raise check.fail(f"{where}.{first}_env", f"is missing: name the variable (or "
                             f"{first}_file) that holds {keys.secrets[first]}")  # fmt: skip
    for name, value in spec.options.items():
        kind = keys.options[name].kind
        if not isinstance(value, kind):
            raise check.fail(f"{where}.{name}", f"must be a {kind.__name__}, got {value!r}")
    problem = sink.problem()
    if problem:
        raise check.fail(f"{where}.{problem[0]}", problem[1])


def key_lines() -> list[str]:
    """Each sink type's own keys, one line a type (``areal-launch keys``)."""
    lines = []
    for kind in sink_types():
        keys = sink_class(kind).keys
        secrets = [f"{n}_env|{n}_file" for n in keys.secrets]
        required = ["required: " + " or ".join(group) for group in keys.required]
        options = [f"{n}={o.default}" for n, o in keys.options.items()]
        said = ", ".join(secrets + options) + "; " + "; ".join(required)
        lines.append(f"watchdog.notify[] type: {kind:10} {said}")
    return lines
