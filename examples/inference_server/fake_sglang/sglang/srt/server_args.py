"""``prepare_server_args``: where AReaL's launch_server hands over its arguments; the stand-in
serves them and never returns.

``AREAL_STANDIN_WEDGE_AFTER=N`` in the environment makes the server wedge after N generate
requests (the rollout worker passes its environment on to the server it starts); with
``AREAL_STANDIN_WEDGE_ONCE=PATH`` too, only the first server to create ``PATH`` does (a job
resumed after the hang finds it and serves)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import sglang_standin  # noqa: E402 - found beside fake_sglang/


def prepare_server_args(argv: list[str]) -> None:
    wedge = os.environ.get("AREAL_STANDIN_WEDGE_AFTER")
    once = os.environ.get("AREAL_STANDIN_WEDGE_ONCE")
    if wedge and once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            wedge = None
    sglang_standin.main([*argv, *(["--wedge-after", wedge] if wedge else [])])
    sys.exit(0)
