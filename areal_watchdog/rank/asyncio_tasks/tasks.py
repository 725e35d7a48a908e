"""Pending asyncio tasks of this process, each with its await chain, read from another thread.

A suspended coroutine is on no thread's stack: py-spy shows only the event-loop thread idling
in ``select``. The rollout side of RL training is async (``agenerate -> arequest_with_retry ->
aiohttp``), so a hang there is invisible to stack dumps. This module walks every task Python
knows of (the interpreter's weak set of tasks, for every loop, uvloop included) and follows
``cr_await`` from the task's coroutine to the innermost awaitable, reading the file and line of
each suspended frame, and the address it awaits when a frame holds one (``url``, ``addr``,
``host``/``port``). It only reads: no loop is entered, nothing is scheduled, no lock is taken.

How long a task has waited is unknown to asyncio; ``TaskClock`` remembers when each task was
first seen at its current await point, so a second snapshot says "pending at least N s". It also
holds the tasks the last snapshot saw, so the next one says how those that ended since did:
returned, raised or cancelled. A retry loop against a dead server ends tasks every second, all by
exception: that is churn, not progress (``diagnose.movement``).
"""

from __future__ import annotations

import asyncio
import re
import time
import types
from dataclasses import dataclass, field
from typing import Any

MAX_DEPTH = 64  # await-chain links followed per task
MAX_WATCHED = 2000  # tasks held from one snapshot to the next, to see how they ended
_ADDRESS = re.compile(r"(?:[a-z][a-z0-9+.-]*://)?(\[[0-9a-fA-F:]+\]|[\w.-]+):(\d{1,5})")
_ADDRESS_LOCALS = ("url", "str_or_url", "addr", "address", "server_addr", "base_url", "endpoint")


@dataclass
class TaskClock:
    """When each (task, await point) was first seen, to tell how long it has been pending."""

    first_seen: dict[tuple[int, str], float] = field(default_factory=dict)
    watched: list[asyncio.Task[Any]] = field(default_factory=list)  # the last snapshot's tasks

    def pending_for(self, task_id: int, where: str, now: float) -> float:
        key = (task_id, where)
        since = self.first_seen.setdefault(key, now)
        return now - since

    def forget_except(self, live: set[tuple[int, str]]) -> None:
        for key in set(self.first_seen) - live:
            del self.first_seen[key]

    def ended_since(self, pending: list[asyncio.Task[Any]]) -> dict[str, int]:
        """How the tasks of the last snapshot that are done now ended; then watch ``pending``."""
        ended = {"ok": 0, "failed": 0, "cancelled": 0}
        for task in self.watched:
            if task.done():
                ended[_outcome(task)] += 1
        self.watched = pending[:MAX_WATCHED]
        return ended


def _outcome(task: asyncio.Task[Any]) -> str:
    """ok | failed | cancelled, read without ``exception()``: that would mark the exception
    retrieved and silence asyncio's own "never retrieved" log line in the job."""
    if task.cancelled():
        return "cancelled"
    return "failed" if getattr(task, "_exception", None) is not None else "ok"


def all_tasks() -> list[asyncio.Task[Any]]:
    """Every task of every loop in this process, done ones excluded; safe from any thread."""
    registry = getattr(asyncio.tasks, "_all_tasks", None)
    if registry is None:  # Python 3.12+: scheduled and eager tasks are kept apart
        registry = set(getattr(asyncio.tasks, "_scheduled_tasks", ())) | set(
            getattr(asyncio.tasks, "_eager_tasks", ())
        )
    for _ in range(5):  # the set may change size while the loop runs: try again
        try:
            return [t for t in list(registry) if not t.done()]
        except RuntimeError:
            continue
    return []


def await_chain(task: asyncio.Task[Any]) -> tuple[list[dict[str, Any]], str | None]:
    """The task's suspended frames, outermost first, and the address it awaits if one is seen."""
    links: list[dict[str, Any]] = []
    target: str | None = None
    awaitable: Any = task.get_coro()
    for _ in range(MAX_DEPTH):
        frame, inner = _frame_and_inner(awaitable)
        if frame is None:
            if awaitable is not None and not links:
                links.append({"name": type(awaitable).__name__, "filename": "", "line": 0})
            break
        code = frame.f_code
        links.append(
            {
                "name": getattr(awaitable, "__qualname__", code.co_name),
                "filename": code.co_filename,
                "line": frame.f_lineno,
            }
        )
        target = _address_in(frame.f_locals) or target
        awaitable = _through_asend(inner, frame)
    return links, target


def _through_asend(inner: Any, frame: types.FrameType) -> Any:
    """An ``async with`` on an ``asynccontextmanager`` awaits its generator's ``asend``, which
    does not say whose: the generator is the frame's ``self.gen`` (``contextlib``), followed on
    into the semaphore, lock or connection it waits for."""
    if type(inner).__name__ != "async_generator_asend":
        return inner
    generator = getattr(frame.f_locals.get("self"), "gen", None)
    return generator if isinstance(generator, types.AsyncGeneratorType) else inner


def _frame_and_inner(awaitable: Any) -> tuple[types.FrameType | None, Any]:
    """A coroutine's (or generator's) frame and what it awaits; a Task continues into its own
    coroutine; a plain Future ends the chain."""
    if isinstance(awaitable, types.CoroutineType):
        return awaitable.cr_frame, awaitable.cr_await
    if isinstance(awaitable, (types.GeneratorType,)):
        return awaitable.gi_frame, awaitable.gi_yieldfrom
    if isinstance(awaitable, types.AsyncGeneratorType):
        return awaitable.ag_frame, awaitable.ag_await
    if isinstance(awaitable, asyncio.Task):
        return _frame_and_inner(awaitable.get_coro())
    return None, None


def _address_in(local_vars: dict[str, Any]) -> str | None:
    for name in _ADDRESS_LOCALS:
        value = local_vars.get(name)
        if value is not None and (match := _ADDRESS.search(str(value)[:300])):
            return f"{match.group(1)}:{match.group(2)}"
    host, port = local_vars.get("host"), local_vars.get("port")
    if isinstance(host, str) and isinstance(port, int):
        return f"{host}:{port}"
    return None


def snapshot(
    clock: TaskClock, max_tasks: int = 500, budget_s: float = 0.2, now: float | None = None
) -> dict[str, Any]:
    """Every pending task (at most ``max_tasks``, the longest-pending kept) as plain data.

    The walk holds the GIL, so it stops after ``budget_s`` seconds (``truncated`` says so)."""
    now = time.time() if now is None else now
    deadline = time.perf_counter() + budget_s
    tasks, live = [], set()
    pending = all_tasks()
    for task in pending:
        if time.perf_counter() > deadline:
            break
        links, target = await_chain(task)
        where = f"{links[-1]['filename']}:{links[-1]['line']}" if links else ""
        live.add((id(task), where))
        tasks.append(
            {
                "name": task.get_name(),
                "chain": links,
                "awaiting": target,
                "pending_s": round(clock.pending_for(id(task), where, now), 3),
            }
        )
    clock.forget_except(live)
    tasks.sort(key=lambda t: -t["pending_s"])
    return {
        "time": now,
        "count": len(pending),
        "ended": clock.ended_since(pending),
        "truncated": len(tasks) < len(pending) or len(tasks) > max_tasks,
        "tasks": tasks[:max_tasks],
    }
