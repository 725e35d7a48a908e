"""Records that cross a process boundary as JSON: a frozen dataclass of plain fields is its
own schema, so its dict form is its fields, and back."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Self


class PlainRecord:
    """Mixed into a dataclass whose fields are all plain JSON values."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        return cls(**data)
