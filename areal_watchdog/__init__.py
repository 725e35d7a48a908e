"""areal-watchdog: launch distributed training with a sidecar that catches and explains hangs.

Training code may call the cheap, optional progress API; every call is a no-op when the job
was not started by ``areal-launch --watchdog``::

    import areal_watchdog
    areal_watchdog.heartbeat(step)
    with areal_watchdog.expect_pause(600, "saving checkpoint"):
        save()
"""

from areal_watchdog.rundir.progress.heartbeat import expect_pause, heartbeat

__version__ = "0.1.0"
__all__ = ["heartbeat", "expect_pause", "__version__"]
