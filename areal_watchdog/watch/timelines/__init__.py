"""The timelines of posted incidents: each drawn by a process of its own while the sidecar watches
(``timeline_drawings``), and what was not drawn or sent when the job ended, finished by a detached
process (``late_finish``, ``python -m areal_watchdog.watch.timelines.late_finish``)."""
