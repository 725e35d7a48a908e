"""An agent workflow with the two bugs ``areal-launch check-workflow`` is for, each switched on
through the job's environment (``launch.env``):

- ``AGENT_POOL_SIZE`` (default 8): the agent framework's session pool, shared by every episode
  on an event loop. An episode holds a session for its whole life and its tool borrows a second
  one: with as many episodes at once as sessions, each holds one and waits for another. One
  episode at a time never shows it; the training's concurrency deadlocks.
- ``AGENT_TOOL_HANGS=1``: the calculator tool (a sandboxed subprocess, ``tool_workflow``) never
  returns, and nothing bounds its wait.

Otherwise it is AReaL's ``RLVRWorkflow`` with the calculator's answer added to the prompt. Run it
with ``AREAL_EXAMPLE_WORKFLOW=agent_workflow.AgentWorkflow`` (``gsm8k_rl.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from areal.workflow.rlvr import RLVRWorkflow
from tool_workflow import CALCULATOR, NEVER_RETURNS, run_tool


class SessionPool:
    """A fixed number of sessions (connections, sandboxes) handed out to whoever asks."""

    def __init__(self, size: int) -> None:
        self._free = asyncio.Semaphore(size)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        async with self._free:
            yield


_POOLS: dict[int, SessionPool] = {}


def pool() -> SessionPool:
    """The running loop's pool (a semaphore belongs to one loop)."""
    size = int(os.environ.get("AGENT_POOL_SIZE", "8"))
    return _POOLS.setdefault(id(asyncio.get_running_loop()), SessionPool(size))


class AgentWorkflow(RLVRWorkflow):
    """Each episode: take a session, ask the calculator (which takes its own), then generate."""

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> Any:
        async with pool().session():
            question = data["messages"][-1]["content"]
            hint = await self.call_tool("1 + 1")
            data = {**data, "messages": [{"role": "user", "content": f"{question} ({hint})"}]}
            return await super().arun_episode(engine, data)

    async def call_tool(self, expression: str) -> str:
        async with pool().session():
            hanging = os.environ.get("AGENT_TOOL_HANGS") == "1"
            return await run_tool(NEVER_RETURNS if hanging else CALCULATOR, expression)
