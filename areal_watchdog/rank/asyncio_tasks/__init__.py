"""This process's pending asyncio tasks, each with its await chain (``tasks``), dumped when the
sidecar asks through a FIFO (``task_listener``): a suspended coroutine is on no thread's stack."""
