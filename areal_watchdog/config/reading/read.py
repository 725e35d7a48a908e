"""Read a config section as its dataclass declares it: each field's type picks the check, its
declaration (``config/reading/keys.py``) the default and bounds; unknown keys are refused. A few
keys need more than their type says (a regular expression that must compile): the caller hands
those in as ``special`` readers by dotted name."""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import Field, fields, is_dataclass
from enum import Enum
from typing import Any

from areal_watchdog.config.reading.checks import Checker, field_default

Special = dict[str, Callable[[Checker, dict[str, Any], str], Any]]


def read_section(
    check: Checker, tree: dict[str, Any], prefix: str, section: type, special: Special
) -> Any:
    """An instance of ``section`` from ``tree``; raises ConfigError naming the first bad key."""
    check.known_keys(tree, prefix, {spec.name for spec in fields(section)})
    hints = typing.get_type_hints(section)
    values: dict[str, Any] = {}
    for spec in fields(section):
        path, kind = f"{prefix}.{spec.name}", hints[spec.name]
        if path in special:
            values[spec.name] = special[path](check, tree, path)
        elif is_dataclass(kind):
            values[spec.name] = read_section(check, check.section(tree, path), path, kind, special)
        else:
            values[spec.name] = read_value(check, tree, path, kind, spec)
    return section(**values)


def read_value(check: Checker, tree: dict[str, Any], path: str, kind: Any, spec: Field) -> Any:
    """One leaf, checked as its type and declaration say."""
    meta = spec.metadata
    default = field_default(spec)
    low = meta.get("minimum")
    if meta.get("auto"):  # absent or 'auto': None, learned at run time
        if tree.get(check.leaf(path), "auto") == "auto":
            return None
        return check.number(tree, path, 0.0, minimum=low, auto=True)
    if isinstance(kind, type) and issubclass(kind, Enum):
        return kind(check.choice(tree, path, tuple(m.value for m in kind), default.value))
    reader = READERS.get(kind)
    if reader is None:
        raise TypeError(f"{path}: no reader for {kind!r}")
    return reader(check, tree, path, default, meta)


READERS: dict[Any, Callable[..., Any]] = {
    bool: lambda c, t, p, d, m: c.boolean(t, p, d),
    int: lambda c, t, p, d, m: c.integer(t, p, d, int(m.get("minimum") or 0), m.get("maximum")),
    float: lambda c, t, p, d, m: c.number(t, p, d, m.get("minimum") or 0.0),
    str: lambda c, t, p, d, m: c.text(t, p, d),
    str | None: lambda c, t, p, d, m: c.optional_text(t, p, d),
    list[str]: lambda c, t, p, d, m: c.string_list(t, p),
    list[int]: lambda c, t, p, d, m: c.int_list(t, p),
    list[int] | None: lambda c, t, p, d, m: None if t.get(c.leaf(p)) is None else c.int_list(t, p),
    dict[str, str]: lambda c, t, p, d, m: c.string_map(t, p),
}
