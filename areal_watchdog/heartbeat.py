"""Compatibility shim: ``areal_watchdog.heartbeat`` moved to ``areal_watchdog.rank.heartbeat``."""

from areal_watchdog.rank.heartbeat import expect_pause, heartbeat

__all__ = ["expect_pause", "heartbeat"]
