"""The exception a retry loop keeps raising, quoted from a process's log tail: a workflow whose
every episode fails (AReaL logs ``Workflow execution failed: ...`` with the traceback, whose
last line names the exception) is one bug repeated, and the report says which. Pure."""

from __future__ import annotations

import re
from collections import Counter

QUOTED_CHARS = 200
# A traceback's last line (``ValueError: cannot parse``), or one inside a log line
# (``episode rejected (ValueError: cannot parse); resubmitting``).
_RAISED = re.compile(
    r"\b((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Timeout|Interrupt)\b:.*?)"
    r"(?=\); |\)$|$)",
    re.M,
)


def repeated_exception(log_tail: str, least: int = 2) -> tuple[str, int] | None:
    """(the exception raised most often in ``log_tail``, how many times), if it was raised at
    least ``least`` times; a ``Traceback`` header or an import path alone is no exception."""
    raised = [m.strip() for m in _RAISED.findall(log_tail)]
    if not raised:
        return None
    text, count = Counter(raised).most_common(1)[0]
    return (text[:QUOTED_CHARS], count) if count >= least else None
