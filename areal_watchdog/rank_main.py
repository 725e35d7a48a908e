"""Compatibility shim: ``areal_watchdog.rank_main`` moved to ``areal_watchdog.rank.main``.

Kept so that command lines and imports written for earlier releases keep working.
"""

import sys

from areal_watchdog.rank.main import *  # noqa: F403
from areal_watchdog.rank.main import main

if __name__ == "__main__":
    sys.exit(main())
