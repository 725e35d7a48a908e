"""Compatibility shim: ``areal_watchdog.sidecar`` moved to ``areal_watchdog.watch.sidecar``.

Kept so that command lines and imports written for earlier releases keep working.
"""

import sys

from areal_watchdog.watch.sidecar import *  # noqa: F403
from areal_watchdog.watch.sidecar import main

if __name__ == "__main__":
    sys.exit(main())
