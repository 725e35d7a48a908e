"""The sinks: one module each, registered in ``registry`` (docs/notifications.md)."""
