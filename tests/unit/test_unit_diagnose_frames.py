"""Whose code a frame is and how summaries show files and counts: a user's own
``areal/my_workflow.py`` must not pass for AReaL's, a requests ``send`` must not pass for a
collective, and "1 ranks wait" must never be written."""

from __future__ import annotations

import pytest

from areal_watchdog.diagnose.one_process.frames import (
    display_path,
    is_areal,
    is_distributed,
    is_library,
)
from areal_watchdog.diagnose.phrases import all_ranks, count, is_are, noun, verb
from areal_watchdog.evidence.model import Frame

SITE = "/venv/lib/python3.11/site-packages"


@pytest.mark.parametrize(
    ("path", "library"),
    [
        ("/home/me/project/train.py", False),
        ("/home/me/project/areal/my_workflow.py", False),  # the user's own areal/ folder
        ("/opt/AReaL/areal/engine/fsdp_engine.py", True),  # AReaL from a clone (uv sync)
        ("/opt/AReaL/areal/__init__.py", True),
        (f"{SITE}/torch/distributed/distributed_c10d.py", True),
        ("/usr/lib/python3.11/threading.py", True),
        ("<frozen runpy>", True),
        ("uvloop/loop.pyx", True),  # compiled code: a relative path
    ],
)
def test_library_frames_are_told_from_the_users_own(path: str, library: bool) -> None:
    assert is_library(Frame("f", path, 1)) is library


def test_only_torch_distributed_files_make_a_distributed_call() -> None:
    assert is_distributed(Frame("broadcast", f"{SITE}/torch/distributed/distributed_c10d.py", 1))
    assert is_distributed(Frame("wait", f"{SITE}/torch/_C/_distributed_c10d.pyi", 1))
    for name, path in [
        ("send", f"{SITE}/requests/adapters.py"),
        ("send", f"{SITE}/zmq/sugar/socket.py"),
        ("barrier", "/home/me/project/sync.py"),
    ]:
        assert not is_distributed(Frame(name, path, 1)), path
    assert is_areal("/x/site-packages/areal/infra/controller/train_controller.py")
    assert not is_areal("/home/me/src/areal/my_workflow.py")


@pytest.mark.parametrize(
    ("path", "cwd", "shown"),
    [
        (f"{SITE}/areal/engine/fsdp_engine.py", None, "site-packages/areal/engine/fsdp_engine.py"),
        ("/usr/lib/python3/dist-packages/yaml/x.py", None, "dist-packages/yaml/x.py"),
        ("/home/me/project/examples/train.py", "/home/me/project", "examples/train.py"),
        ("/home/me/project/examples/train.py", "/home/me/project/", "examples/train.py"),
        # a sibling folder that shares the prefix is not below the working directory
        ("/home/me/project2/train.py", "/home/me/project", "/home/me/project2/train.py"),
        ("/home/me/src/areal/my_workflow.py", None, "/home/me/src/areal/my_workflow.py"),
    ],
)
def test_files_in_summaries_cannot_be_mistaken(path: str, cwd: str | None, shown: str) -> None:
    assert display_path(path, cwd) == shown


def test_words_agree_with_how_many_they_are_about() -> None:
    one, many = [3], [0, 1, 2, 3]
    assert all_ranks(one, "wait") == "Rank 3 waits"
    assert all_ranks(many, "wait") == "All 4 ranks wait"
    assert (verb(one, "wait"), verb(many, "wait")) == ("waits", "wait")
    assert (is_are(one), is_are(many)) == ("is", "are")
    assert (noun(one, "server"), noun(many, "server")) == ("server", "servers")
    assert (count(1, "episode"), count(0, "episode"), count(8, "episode")) == (
        "1 episode",
        "0 episodes",
        "8 episodes",
    )
