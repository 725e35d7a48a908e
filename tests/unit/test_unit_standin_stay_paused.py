"""The SGLang stand-in's lost continue (``--stay-paused-after N``), which HangBench's
``areal-paused_server`` stands on: the continue after its N-th pause is lost, every earlier one
resumes it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

STANDIN = (
    Path(__file__).resolve().parents[2] / "examples" / "inference_server" / "sglang_standin.py"
)


def _state(stay_paused_after: int | None) -> object:
    spec = importlib.util.spec_from_file_location("sglang_standin", STANDIN)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    state = module.State(sampler=None, wedge_after=None, latency=0.0)
    state.stay_paused_after = stay_paused_after
    return state


def test_the_continue_after_the_nth_pause_is_lost_and_no_earlier_one() -> None:
    state = _state(stay_paused_after=2)
    state.pause(True)
    state.pause(False)
    assert not state.paused  # the first weight update's pause and continue: answered
    state.pause(True)
    state.pause(False)
    assert state.paused  # the second continue is lost: paused for good
    state.pause(False)
    assert state.paused


def test_without_the_flag_every_continue_resumes() -> None:
    state = _state(stay_paused_after=None)
    for _ in range(3):
        state.pause(True)
        state.pause(False)
        assert not state.paused
