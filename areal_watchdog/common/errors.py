"""Errors that reach the user as one clear paragraph instead of a traceback."""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; the CLI prints it and exits with code 2."""


class ConfigError(UserError):
    """A bad configuration value, naming the file and the key."""

    def __init__(self, source: str, key: str, message: str) -> None:
        self.source = source
        self.key = key
        super().__init__(f"{source}: `{key}`: {message}")
