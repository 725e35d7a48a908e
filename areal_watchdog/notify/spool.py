"""The spool: deliveries not yet confirmed, kept in ``<run_dir>/watchdog/spool`` until a later
attempt succeeds, and the ledger of delivered ids (``delivered.jsonl``) so nothing is sent twice.

Everything here survives damage: a ledger line cut short by a crash or a full disk, junk bytes,
or a spool entry that is not ours is skipped with one warning, never a crash, because every
``areal-launch`` command touching the run and the sidecar's notifier thread read these files.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import open_append, read_json, write_json_atomic
from areal_watchdog.config.sinks import SinkSpec


class Spool:
    """One run's spool directory; ``warn`` hears about damaged files once each."""

    def __init__(self, directory: Path, warn: Callable[[str], None] = lambda _m: None) -> None:
        self.directory = directory
        self.delivered_log = directory / "delivered.jsonl"
        self.lock = threading.Lock()
        self.warn = warn
        self.warned: set[str] = set()

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            self.warn(message)

    def delivered_ids(self) -> set[str]:
        """Ids in the ledger; damaged lines are skipped (the rest still counts)."""
        try:
            data = self.delivered_log.read_bytes()
        except OSError:
            return set()
        ids, bad = set(), 0
        for line in data.splitlines():
            try:
                ids.add(str(json.loads(line.decode("utf-8"))["id"]))
            except (ValueError, KeyError, TypeError):
                bad += bool(line.strip())
        if bad:
            self._warn_once(
                "ledger",
                f"spool ledger {self.delivered_log}: {bad} damaged line(s) skipped "
                "(a crash or a full disk cut them short); the other deliveries still count",
            )
        return ids

    def mark_delivered(self, message_id: str, thread: dict[str, str] | None = None) -> None:
        """Record a delivery (with the Slack thread it started, if any) and tidy its entry."""
        with self.lock:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            record: dict[str, Any] = {"id": message_id, "time": time.time()}
            if thread:
                record["thread"] = thread
            line = json.dumps(record) + "\n"
            if not _ends_a_line(self.delivered_log):
                line = "\n" + line  # after a line cut short, start a fresh one
            with open_append(self.delivered_log) as fh:
                fh.write(line)
            self._entry(message_id).unlink(missing_ok=True)

    def thread_of(self, message_id: str) -> dict[str, str] | None:
        """The Slack thread a delivered message started (its channel and ts), if it did."""
        try:
            lines = self.delivered_log.read_bytes().splitlines()
        except OSError:
            return None
        for line in lines:
            try:
                record = json.loads(line.decode("utf-8"))
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("id") == message_id:
                thread = record.get("thread")
                return thread if isinstance(thread, dict) else None
        return None

    def drop(self, message_id: str) -> None:
        """Forget a delivery the receiver refused for good (a 4xx other than 408/429)."""
        self._entry(message_id).unlink(missing_ok=True)

    def holds(self, message_id: str) -> bool:
        return self._entry(message_id).exists()

    def keep(self, message_id: str, spec: SinkSpec, body: bytes, error: str) -> None:
        """Store a failed delivery: the sink's secret-free spec and the (scrubbed) body."""
        with self.lock:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            path = self._entry(message_id)
            previous = read_json(path)
            previous = previous if isinstance(previous, dict) else {}
            entry = {
                "id": message_id,
                "sink": spec.to_dict(),
                "body": body.decode("utf-8"),
                "created": previous.get("created", time.time()),
                "last_error": error,
                "tries": _int(previous.get("tries")) + 1,
            }
            write_json_atomic(path, entry, fsync=True)

    def pending(self) -> list[tuple[dict[str, Any], SinkSpec]]:
        """Every spooled delivery with its sink; damaged entries are skipped and named once."""
        if not self.directory.is_dir():
            return []
        entries = []
        for path in sorted(self.directory.glob("msg_*.json")):
            entry = read_json(path)
            try:
                if not isinstance(entry["id"], str) or not isinstance(entry["body"], str):
                    raise TypeError
                entries.append((entry, SinkSpec.from_dict(entry["sink"])))
            except (KeyError, TypeError, ValueError):
                self._warn_once(str(path), f"spool entry {path} is damaged: skipped")
        return entries

    def _entry(self, message_id: str) -> Path:
        return self.directory / f"{message_id}.json"


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _ends_a_line(path: Path) -> bool:
    """True when ``path`` is missing, empty or ends with a newline."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            if fh.tell() == 0:
                return True
            fh.seek(-1, 2)
            return fh.read(1) == b"\n"
    except OSError:
        return True
