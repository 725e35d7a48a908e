"""A folder for ``PYTHONPATH`` holding our ``sitecustomize`` (``areal_watchdog.rank.hook``)."""

from pathlib import Path

DIRECTORY = str(Path(__file__).resolve().parent)
