"""Secrets that must never be shown: scrubbed from anything the watchdog writes or sends
(``redact``) and masked as ``***`` in the job's own output (``mask``). A new way to keep a secret
out of sight belongs here."""
