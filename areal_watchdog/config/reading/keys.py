"""How a config key is declared: once, on its dataclass field, with its default, its bounds and
a one-line doc. Validation (``config/validate.py``), ``areal-launch keys`` and the test that
holds docs/configuration.md to the dataclasses all read these declarations."""

from __future__ import annotations

import typing
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass
from enum import Enum
from typing import Any

from areal_watchdog.config.reading.checks import field_default


class Choice(str, Enum):
    """A key whose value is one of a few words; formats and prints as the word itself."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


def key(
    default: Any = MISSING,
    doc: str = "",
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    shown: str | None = None,
    auto: bool = False,
    factory: Any = None,
    kind: str | None = None,
) -> Any:
    """A field that is a config key. ``shown``: how the docs write its default when the value
    does not say it (``auto``, ``all``); ``auto``: the word ``auto`` (or nothing) means None."""
    meta = {"doc": doc, "minimum": minimum, "maximum": maximum, "shown": shown, "auto": auto,
            "kind": kind}  # fmt: skip
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Declared:
    """One key as users see it: ``watchdog.gpu.idle_timeout``, its type, default and doc."""

    path: str
    type: Any
    default: Any
    field: Field

    @property
    def doc(self) -> str:
        return self.field.metadata.get("doc", "")

    def kind(self) -> str:
        """Its type in words: ``number or auto``, ``auto|nvml|...``, ``list of int``."""
        if self.field.metadata.get("kind"):
            return self.field.metadata["kind"]
        if self.field.metadata.get("auto"):
            return "number|auto"
        kind = self.type
        if isinstance(kind, type) and issubclass(kind, Enum):
            return "|".join(m.value for m in kind)
        words = {bool: "bool", int: "int", float: "number", str: "text"}
        if kind in words:
            return words[kind]
        return str(kind).replace(" | None", " or null").replace("str", "text")

    def line(self) -> str:
        """``watchdog.gpu.idle_timeout  number  120  seconds every GPU idle ...``"""
        return f"{self.path:36} {self.kind():34} {self.shown():10} {self.doc}"

    def shown(self) -> str:
        """The default as docs/configuration.md writes it."""
        told = self.field.metadata.get("shown")
        if told is not None:
            return told
        value = self.default
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, Enum):
            return str(value.value)
        if isinstance(value, float):
            return f"{value:g}"
        if isinstance(value, (list, dict)) and not value:
            return "[]" if isinstance(value, list) else "{}"
        return "-" if value is None else str(value)


def declared(section: type, prefix: str) -> list[Declared]:
    """Every key of a section, nested sections' keys under their name, in declaration order."""
    hints = typing.get_type_hints(section)
    found: list[Declared] = []
    for spec in fields(section):
        kind = hints[spec.name]
        path = f"{prefix}.{spec.name}"
        if is_dataclass(kind):
            found += declared(kind, path)
        else:
            found.append(Declared(path, kind, field_default(spec), spec))
    return found
