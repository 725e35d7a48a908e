"""The stages' episodes, timed one by one, and what is still pending when a stage's time is up.

Every episode runs inside ``Episodes.timed``, whether this module schedules it (one episode, one
batch: on an event loop of its own thread) or AReaL's rollout engine does (on its own loop): so
each has a start, an end, an outcome and, while pending, its task. At the limit a pending
episode's await chain is read from that task (``rank.asyncio_tasks.tasks``: a suspended coroutine is
on no thread's stack), from the workflow's frame inward; a loop blocked in synchronous code (a tool
called without ``await``) is shown by its thread's stack instead."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import types
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from areal_watchdog.rank.asyncio_tasks.tasks import await_chain
from areal_watchdog.workflow_check.model import StageResult

MAX_ERRORS = 3
MAX_PENDING_SHOWN = 8
LOOP_ANSWER_S = 1.0
MAX_BLOCKED_FRAMES = 8


@dataclass
class Episode:
    """One episode's life: ``outcome`` is pending until it ends (done, rejected, failed)."""

    label: str
    started: float | None = None
    ended: float | None = None
    outcome: str = "pending"
    error: str = ""
    task: asyncio.Task[Any] | None = None


class Episodes:
    """Every episode of one stage, in the order they were started."""

    def __init__(self) -> None:
        self.items: list[Episode] = []
        self.loop: asyncio.AbstractEventLoop | None = None  # when this module runs the loop
        self._lock = threading.Lock()

    def add(self, label: str) -> Episode:
        with self._lock:
            self.items.append(Episode(label))
            return self.items[-1]

    async def timed(self, episode: Episode, work: Awaitable[Any]) -> Any:
        """Run one episode, recording when and how it ended; its result passes through."""
        episode.task = asyncio.current_task()
        episode.started = time.monotonic()
        try:
            result = await work
        except BaseException as exc:
            episode.outcome = "failed"
            episode.error = one_line(exc)
            raise
        finally:
            episode.ended = time.monotonic()
        episode.outcome = "rejected" if result is None else "done"
        return result


def one_line(exc: BaseException) -> str:
    """An exception as a table shows it: its type and first line, at most 300 characters."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def run_on_own_loop(
    jobs: list[tuple[str, Callable[[], Awaitable[Any]]]], at_once: int, limit: float
) -> tuple[Episodes, float, threading.Thread]:
    """Run every job as an episode, ``at_once`` at a time, on a loop in a thread of its own;
    return when all ended or ``limit`` seconds passed (the thread may still run)."""
    episodes = Episodes()

    async def all_jobs() -> None:
        episodes.loop = asyncio.get_running_loop()
        gate = asyncio.Semaphore(at_once)

        async def one(label: str, make: Callable[[], Awaitable[Any]]) -> None:
            episode = episodes.add(label)
            async with gate:
                await episodes.timed(episode, make())

        await asyncio.gather(*(one(label, make) for label, make in jobs), return_exceptions=True)

    thread = threading.Thread(target=asyncio.run, args=(all_jobs(),), daemon=True)
    return episodes, *wait_thread(thread, limit)


def wait_thread(thread: threading.Thread, limit: float) -> tuple[float, threading.Thread]:
    """Start ``thread`` and wait for it at most ``limit`` s; the seconds waited, the thread."""
    start = time.monotonic()
    thread.start()
    thread.join(limit)
    return time.monotonic() - start, thread


def summarise(
    name: str, detail: str, planned: int, episodes: Episodes, wall: float, limit: float,
    loop_thread: threading.Thread | None = None, errors: list[str] | None = None,
) -> StageResult:  # fmt: skip
    """The stage's record: counts, latencies, the first distinct errors, the pending chains."""
    items = list(episodes.items)
    count = {o: sum(e.outcome == o for e in items) for o in ("done", "failed", "rejected")}
    started = [e for e in items if e.started is not None]
    pending = [e for e in started if e.outcome == "pending"]
    errors = list(dict.fromkeys([*(errors or []), *(e.error for e in items if e.error)]))
    alive = loop_thread is not None and loop_thread.is_alive()
    blocked = _blocked_stack(loop_thread) if alive and not _answers(episodes.loop) else []
    holder = next((e for e in pending if blocked and _runs(e)), None)
    shown = [_pending(e, blocked if e is holder else None) for e in pending[:MAX_PENDING_SHOWN]]
    return StageResult(
        name, detail, planned, count["done"], count["failed"], count["rejected"],
        len(pending), planned - len(started),
        [round(e.ended - e.started, 3) for e in started if e.ended is not None],
        round(wall, 3), limit, errors[:MAX_ERRORS],
        shown, blocked, holder.label if holder else "",
    )  # fmt: skip


def _runs(episode: Episode) -> bool:
    """Is the episode's coroutine the one on the loop thread's stack (holding the loop)?"""
    coro = episode.task.get_coro() if episode.task else None
    return bool(getattr(coro, "cr_running", False))


def _pending(episode: Episode, holding: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The episode's await chain from the workflow inward (this module's frames left out); for
    the episode that holds a blocked loop, the loop thread's stack (it awaits nothing)."""
    links, awaiting = await_chain(episode.task) if episode.task else ([], None)
    links = _from_workflow(holding if holding is not None else links)
    age = time.monotonic() - (episode.started or time.monotonic())
    entry = {"episode": episode.label, "pending_s": round(age, 1), "chain": links,
             "awaiting": None if holding is not None else awaiting}  # fmt: skip
    return {**entry, "holds_loop": True} if holding is not None else entry


def _from_workflow(links: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The frames inward of this module's own (``timed``): the workflow's and below."""
    own = [i for i, link in enumerate(links) if link["filename"] == __file__]
    return links[own[-1] + 1 :] if own else links


def _answers(loop: asyncio.AbstractEventLoop | None) -> bool:
    """Does the loop run a callback within a second? One held by synchronous code (a tool
    called without ``await``) runs no episode at all."""
    if loop is None or loop.is_closed():
        return True
    ran = threading.Event()
    loop.call_soon_threadsafe(ran.set)
    return ran.wait(LOOP_ANSWER_S)


def _blocked_stack(thread: threading.Thread) -> list[dict[str, Any]]:
    """The blocked loop thread's stack, outermost first, with qualified names as the await
    chains have them: from the workflow's frame inward where an episode holds it."""
    frame: types.FrameType | None = sys._current_frames().get(thread.ident or -1)
    stack = []
    while frame is not None:
        stack.append({"name": frame.f_code.co_qualname, "filename": frame.f_code.co_filename,
                      "line": frame.f_lineno})  # fmt: skip
        frame = frame.f_back
    return _from_workflow(stack[::-1])[-MAX_BLOCKED_FRAMES:]
