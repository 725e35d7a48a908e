"""AReaL's ``RLVRWorkflow`` with a calculator tool: the data-dependent hang of the AReaL demo.

A prompt that asks for the calculator (GSM8K rows marked ``POISON`` by
``harness/make_tiny.py``) first runs the tool in a sandboxed subprocess, as agentic workflows do;
the sandbox has no time limit, and for these rows the tool never returns. The episode's
coroutine then waits forever in ``run_tool``: on no thread's stack (py-spy sees the rollout
worker's event loop idle), but in the watchdog's asyncio task dump. Once every rollout slot
(``rollout.max_concurrent_rollouts``) holds such an episode, ``prepare_batch`` in the controller
waits forever: a hang AReaL itself would only notice after ``rollout.request_timeout``. Rows
marked ``SLOWTOOL`` get their answer after ``AREAL_EXAMPLE_SLOW_TOOL_S`` seconds: slow, not
stuck.

Nothing here edits AReaL: AReaL loads this class by its import string, in its rollout workers.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from areal.workflow.rlvr import RLVRWorkflow

POISON = "POISON"
SLOW_TOOL = "SLOWTOOL"
CALCULATOR = "import sys; print(eval(sys.stdin.read(), {'__builtins__': {}}))"
NEVER_RETURNS = "import time; time.sleep(10**6)"  # a tool that hangs on this input
SLOW = "import time; time.sleep({seconds}); print(2)"  # slow on this input, then fine


async def run_tool(program: str, expression: str) -> str:
    """Run the calculator in a subprocess (the sandbox) and wait for its answer, without a
    time limit: the bug."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        program,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate(expression.encode())
    return out.decode().strip()


class ToolRLVRWorkflow(RLVRWorkflow):
    """Samples that ask for the calculator get its answer added to the prompt first."""

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> Any:
        question = data["messages"][-1]["content"]
        program = None
        if question.startswith(POISON):
            program = NEVER_RETURNS
        elif question.startswith(SLOW_TOOL):
            program = SLOW.format(seconds=float(os.environ.get("AREAL_EXAMPLE_SLOW_TOOL_S", "0")))
        if program is not None:
            hint = await run_tool(program, "1 + 1")
            data = {**data, "messages": [{"role": "user", "content": f"{question} ({hint})"}]}
        return await super().arun_episode(engine, data)
