"""Small words that agree with how many ranks or processes a sentence is about."""

from __future__ import annotations

from collections.abc import Sized


def cap(text: str) -> str:
    """The sentence's first letter in upper case."""
    return text[:1].upper() + text[1:]


def is_are(items: Sized) -> str:
    return "is" if len(items) == 1 else "are"


def verb(items: Sized, word: str) -> str:
    """``wait`` -> ``waits`` for one subject, ``wait`` for several."""
    return f"{word}s" if len(items) == 1 else word


def them(items: Sized) -> str:
    return "it" if len(items) == 1 else "them"
