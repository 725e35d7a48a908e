"""Scrub secrets from anything the watchdog writes or sends.

Removed: values of environment variables whose names look secret (``*TOKEN*``, ``*SECRET*``,
``*KEY*``, ``*PASSWORD*``, ...), credentials inside URLs, ``name=value`` pairs whose name looks
secret (``password=...``, ``api_key: ...``), well-known token formats (GitHub, Slack, OpenAI,
Hugging Face, AWS, bearer tokens, Standard Webhooks secrets), and any extra value given (the
configured webhook URLs and signing secrets). Scrub before truncating: a cut can leave half a
secret that no longer matches.
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
# Every pattern below reads each character a bounded number of times (possessive quantifiers,
# a match that always consumes its run): a 10 MB log line must not pin the sidecar.
_URL_CREDENTIALS = re.compile(
    r"(?<![a-zA-Z0-9+.-])(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*+://)[^/\s:@]++:[^/\s@]++@"
)
_SLACK_HOOK = re.compile(r"https://hooks\.slack\.com/services/[A-Za-z0-9/_-]+")
# A secret-looking word, the rest of its name, then (optionally) ``=``/``:`` and the value. The
# value part is optional so that a name without one still consumes its run of characters.
_SECRET_PAIR = re.compile(
    r"(?i)(?:password|passwd|passphrase|secret|token|api[_-]?key|access[_-]?key|"
    r"private[_-]?key|credential)[\w.-]*+"
    r"(?:(?P<sep>[\"']?\s*+[=:]\s*+[\"']?)(?P<value>[^\s\"',;&]{4,}+))?"
)
_TOKENS = re.compile(
    r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}|"
    r"\bxox[abposr]-[A-Za-z0-9-]{10,}|\bsk-[A-Za-z0-9_-]{20,}|\bhf_[A-Za-z0-9]{20,}|"
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b|\bwhsec_[A-Za-z0-9+/=]{10,}|"
    r"(?i:\bbearer\s+)[A-Za-z0-9._~+/=-]{10,}"
)
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
        text = _SLACK_HOOK.sub(f"https://hooks.slack.com/services/{REDACTED}", text)
        text = _TOKENS.sub(REDACTED, text)
        return _SECRET_PAIR.sub(_redact_pair, text)

    def scrub_tree(self, data: Any) -> Any:
        """Scrub every string inside nested dicts and lists."""
        if isinstance(data, str):
            return self.scrub(data)
        if isinstance(data, dict):
            return {k: self.scrub_tree(v) for k, v in data.items()}
        if isinstance(data, (list, tuple)):
            return [self.scrub_tree(v) for v in data]
        return data


def _redact_pair(match: re.Match[str]) -> str:
    """``password=hunter2`` -> ``password=[REDACTED]``; a bare word stays as it was."""
    if match["value"] is None:
        return match[0]
    return match[0][: match.start("value") - match.start()] + REDACTED
