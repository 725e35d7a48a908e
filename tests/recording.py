"""Keep what a real hang left behind as a regression fixture, when asked to.

``AREAL_RECORD_FIXTURES=1 pytest -m slow tests/test_collective_evidence.py
tests/test_engine_worker.py tests/test_areal.py`` copies each real hang's ``evidence.json`` to
``tests/data/evidence/<name>.json`` and its Flight Recorder dumps to
``tests/data/flight_recorder/<set>/``; without the variable nothing is written.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

DATA = Path(__file__).parent / "data"
RECORDING = os.environ.get("AREAL_RECORD_FIXTURES") == "1"


def record_evidence(report: dict, name: str, folder: str = "evidence") -> None:
    """Copy the incident's evidence.json as ``tests/data/<folder>/<name>.json``."""
    if RECORDING:
        shutil.copyfile(report["files"]["evidence"], DATA / folder / f"{name}.json")


def record_result(result: Path, name: str, folder: str) -> None:
    """Copy a command's ``result.json`` as ``tests/data/<folder>/<name>.json``."""
    if RECORDING:
        (DATA / folder).mkdir(exist_ok=True)
        shutil.copyfile(result, DATA / folder / f"{name}.json")


def record_dumps(dump_dir: Path, set_name: str) -> None:
    """Copy a dump directory (``pickle/``, ``json/``, ``active/``) as one fixture set."""
    if RECORDING:
        target = DATA / "flight_recorder" / set_name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(dump_dir, target)
