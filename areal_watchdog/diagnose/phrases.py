"""Small words that agree with how many ranks or processes a sentence is about."""

from __future__ import annotations

from collections.abc import Sized

from areal_watchdog.common.rankset import ranks_phrase


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


def their(items: Sized) -> str:
    return "its" if len(items) == 1 else "their"


def all_ranks(ranks: list[int], word: str) -> str:
    """``All 4 ranks wait``; a lone rank: ``Rank 0 waits``."""
    if len(ranks) == 1:
        return f"{cap(ranks_phrase(ranks))} {word}s"
    return f"All {len(ranks)} ranks {word}"


def noun(items: Sized, word: str) -> str:
    """``server`` for one, ``servers`` for several."""
    return word if len(items) == 1 else f"{word}s"


def count(n: int, word: str) -> str:
    """``1 episode``, ``3 episodes``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
