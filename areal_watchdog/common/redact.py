"""Scrub secrets from anything the watchdog writes or sends.

Removed: values of environment variables whose names look secret (``*TOKEN*``, ``*SECRET*``,
``*KEY*``, ``*PASSWORD*``, ...), credentials inside URLs, and any extra value given (the
configured webhook URLs and signing secrets).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "[REDACTED]"
SECRET_NAME = re.compile(
    r"TOKEN|SECRET|KEY|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|WEBHOOK",
    re.I,
)
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@")
_SLACK_HOOK = re.compile(r"https://hooks\.slack\.com/services/[A-Za-z0-9/_-]+")
_MIN_SECRET_LENGTH = 6  # shorter values ("1", "true") would mangle ordinary text


class Redactor:
    """Replaces known secret values and credential-looking URLs with ``[REDACTED]``."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        unique = {v for v in values if v and len(v) >= _MIN_SECRET_LENGTH}
        self.values = sorted(unique, key=len, reverse=True)

    @classmethod
    def from_environment(
        cls, env: Mapping[str, str] | None = None, extra: Iterable[str] = ()
    ) -> Redactor:
        """Every secret-looking variable of ``env`` (default: this process's), plus ``extra``."""
        env = os.environ if env is None else env
        found = [value for name, value in env.items() if SECRET_NAME.search(name)]
        return cls([*found, *extra])

    def with_values(self, extra: Iterable[str]) -> Redactor:
        return Redactor([*self.values, *extra])

    def scrub(self, text: str) -> str:
        for value in self.values:
            if value in text:
                text = text.replace(value, REDACTED)
        text = _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
        return _SLACK_HOOK.sub(f"https://hooks.slack.com/services/{REDACTED}", text)

    def scrub_tree(self, data: Any) -> Any:
        """Scrub every string inside nested dicts and lists."""
        if isinstance(data, str):
            return self.scrub(data)
        if isinstance(data, dict):
            return {k: self.scrub_tree(v) for k, v in data.items()}
        if isinstance(data, (list, tuple)):
            return [self.scrub_tree(v) for v in data]
        return data
