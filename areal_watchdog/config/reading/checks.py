"""Typed reads of config values: each raises a ConfigError naming the file, the key and the fix.

A key's default is passed in by the caller, who takes it from the dataclass in ``model``.
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import MISSING, Field, fields
from typing import Any

from areal_watchdog.common.errors import ConfigError


def default(section: type, name: str) -> Any:
    """A field's default, as declared once on its dataclass."""
    return field_default(next(f for f in fields(section) if f.name == name))


def field_default(spec: Field) -> Any:
    """The default a dataclass field declares (its factory's value, for a list or a dict)."""
    return spec.default_factory() if spec.default is MISSING else spec.default  # type: ignore[misc]


class Checker:
    """Reads leaves of one config file's tree; ``key`` is the dotted name users see."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(self.source, key, message)

    @staticmethod
    def leaf(key: str) -> str:
        return key.rsplit(".", 1)[-1]

    def known_keys(self, tree: dict[str, Any], prefix: str, known: set[str]) -> None:
        """An unknown key is a typo until proven otherwise: name it and the closest known one."""
        for name in tree:
            if str(name) in known:
                continue
            close = difflib.get_close_matches(str(name), sorted(known), n=1, cutoff=0.6) or [
                k for k in sorted(known) if len(os.path.commonprefix([k, str(name)])) >= 4
            ]
            hint = (
                f" (did you mean {close[0]}?)" if close else f"; known: {', '.join(sorted(known))}"
            )
            raise self.fail(f"{prefix}.{name}", f"unknown key{hint}")

    def section(self, tree: dict[str, Any], key: str) -> dict[str, Any]:
        value = tree.get(self.leaf(key))
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a mapping, got {type(value).__name__} {value!r}")
        return value

    def text(self, tree: dict[str, Any], key: str, default: str) -> str:
        value = tree.get(self.leaf(key), default)
        if value is None:
            return default
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise self.fail(key, f"must be a string, got {value!r}")
        return str(value)

    def optional_text(self, tree: dict[str, Any], key: str, default: str | None) -> str | None:
        value = tree.get(self.leaf(key), default)
        return None if value is None else self.text(tree, key, str(value))

    def boolean(self, tree: dict[str, Any], key: str, default: bool) -> bool:
        value = tree.get(self.leaf(key), default)
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {value!r}")
        return value

    def integer(
        self, tree: dict[str, Any], key: str, default: int, minimum: int, maximum: int | None = None
    ) -> int:
        value = tree.get(self.leaf(key), default)
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
                value = int(value)  # "²" is a digit to isdigit(), not to int()
            else:
                raise self.fail(key, f"must be a whole number, got {value!r}")
        if value < minimum:
            raise self.fail(key, f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise self.fail(key, f"must be at most {maximum}, got {value}")
        return value

    def number(
        self, tree: dict[str, Any], key: str, default: float, minimum: float, auto: bool = False
    ) -> float:
        """Seconds (or a factor): finite, at least ``minimum`` (0 < minimum < 1e-6: positive)."""
        value = tree.get(self.leaf(key), default)
        hint = " or 'auto'" if auto else ""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"must be a number{hint}, got {value!r}")
        if not math.isfinite(value):
            raise self.fail(key, f"must be a finite number{hint}, got {value}")
        if value < minimum:
            bound = "positive" if 0 < minimum < 1e-6 else f"at least {minimum:g}"
            raise self.fail(key, f"must be {bound}{hint}, got {value:g}")
        return float(value)

    def choice(self, tree: dict[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
        value = tree.get(self.leaf(key), default)
        if value not in choices:
            raise self.fail(key, f"must be one of {', '.join(choices)}; got {value!r}")
        return value

    def string_list(self, tree: dict[str, Any], key: str) -> list[str]:
        value = tree.get(self.leaf(key)) or []
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or any(isinstance(v, (dict, list)) for v in value):
            raise self.fail(key, f"must be a list of strings, got {value!r}")
        return [str(v) for v in value]

    def string_map(self, tree: dict[str, Any], key: str) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.section(tree, key).items() if v is not None}

    def int_list(self, tree: dict[str, Any], key: str) -> list[int]:
        value = tree.get(self.leaf(key)) or []
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise self.fail(key, f"must be a list of step numbers, got {value!r}")
        return value

    def mapping_list(self, tree: dict[str, Any], key: str) -> list[dict[str, Any]]:
        value = tree.get(self.leaf(key)) or []
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise self.fail(key, "must be a list of mappings")
        return value
