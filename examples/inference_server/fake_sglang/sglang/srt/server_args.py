"""``prepare_server_args``: where AReaL's launch_server hands over its arguments; the stand-in
serves them and never returns.

``AREAL_STANDIN_WEDGE_AFTER=N`` in the environment makes the server wedge after N generate
requests (the rollout worker passes its environment on to the server it starts)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import sglang_standin  # noqa: E402 - found beside fake_sglang/


def prepare_server_args(argv: list[str]) -> None:
    wedge = os.environ.get("AREAL_STANDIN_WEDGE_AFTER")
    sglang_standin.main([*argv, *(["--wedge-after", wedge] if wedge else [])])
    sys.exit(0)
