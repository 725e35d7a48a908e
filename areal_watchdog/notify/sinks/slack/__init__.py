"""Slack: the sink (``sink``), the message it posts, kept within Slack's limits (``message``),
and the timeline picture it uploads into the report's thread (``upload``)."""
