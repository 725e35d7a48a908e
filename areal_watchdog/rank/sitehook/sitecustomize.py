"""Loaded by Python at start-up in every process of a watched job (this folder is on the job's
``PYTHONPATH``): arms the watchdog in AReaL's controller, workers and servers, which no wrapper
of ours starts. Does nothing outside a watched job, never fails the process, and then runs the
``sitecustomize`` this one shadows, if any."""

import importlib.machinery
import importlib.util
import os
import sys


def _arm() -> None:
    if not os.environ.get("AREAL_WATCHDOG_RUN_ID"):
        return
    try:
        from areal_watchdog.rank.hook import install

        install()
    except Exception:  # noqa: BLE001 - the job must never notice the watchdog
        pass


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_arm()
_chain()
