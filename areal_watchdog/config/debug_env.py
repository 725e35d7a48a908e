"""The debug environment exported to every rank (AReaL's debugging guide), before overrides.

Values may name ``{watch_dir}``; ``watchdog.debug_env`` in the config overrides any entry or
switches it off with ``null``.
"""

from __future__ import annotations

DEFAULT_DEBUG_ENV: dict[str, str] = {
    # INFO logs process-group creation; DETAIL wraps every collective in a fingerprint check that
    # turns some mismatches into immediate errors at a per-collective cost (opt in for that).
    "TORCH_DISTRIBUTED_DEBUG": "INFO",
    "NCCL_DEBUG": "WARN",
    "NCCL_DEBUG_SUBSYS": "INIT,COLL",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    # Flight Recorder: keep the last collectives per rank and dump them on timeout or on request.
    "TORCH_FR_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "{watch_dir}/flight_recorder/rank_",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "{watch_dir}/flight_recorder/pipe_rank_",
    "PYTHONFAULTHANDLER": "1",
    # A hint for training code: pass it to init_process_group(timeout=...) instead of AReaL's
    # 7200 s, so NCCL itself gives up sooner once the watchdog has taken its evidence.
    "AREAL_WATCHDOG_COLLECTIVE_TIMEOUT": "900",
}


def render_debug_env(template: dict[str, str], watch_dir: str) -> dict[str, str]:
    """Fill the ``{watch_dir}`` placeholders of a debug environment."""
    return {name: value.replace("{watch_dir}", watch_dir) for name, value in template.items()}
