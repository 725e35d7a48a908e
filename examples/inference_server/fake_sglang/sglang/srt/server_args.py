"""``prepare_server_args``: where AReaL's launch_server hands over its arguments; the stand-in
serves them and never returns.

``AREAL_STANDIN_WEDGE_AFTER=N`` in the environment makes the server stop generating (and
answering its health check) after N generate requests (the rollout worker passes its
environment on to the server it starts); with ``AREAL_STANDIN_WEDGE_ONCE=PATH`` too, only the
first server to create ``PATH`` does (a job resumed after the hang finds it and serves).
``AREAL_STANDIN_HOLD_UPDATE_AFTER=N`` makes it never answer the weight update after its N-th;
with ``AREAL_STANDIN_HOLD_UPDATE_CLAIM=PATH`` only the first server to create ``PATH`` (one of
the job's servers), which writes its address there.
``AREAL_STANDIN_DIE_AFTER_UPDATE=N`` SIGKILLs the server at its first generate request after its
N-th weight update. ``AREAL_STANDIN_STAY_PAUSED_AFTER=N`` keeps it paused after its N-th pause
(generation paused around a weight update and never resumed)."""

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
    die = os.environ.get("AREAL_STANDIN_DIE_AFTER_UPDATE")
    paused = os.environ.get("AREAL_STANDIN_STAY_PAUSED_AFTER")
    sglang_standin.main(
        [*argv, *(["--wedge-after", wedge] if wedge else []), *_hold_update(),
         *(["--die-after-update", die] if die else []),
         *(["--stay-paused-after", paused] if paused else [])]
    )  # fmt: skip
    sys.exit(0)


def _hold_update() -> list[str]:
    """The stand-in's flags for a lost weight update, from the environment."""
    after = os.environ.get("AREAL_STANDIN_HOLD_UPDATE_AFTER")
    claim = os.environ.get("AREAL_STANDIN_HOLD_UPDATE_CLAIM")
    if not after:
        return []
    return ["--hold-update-after", after, *(["--hold-update-claim", claim] if claim else [])]
