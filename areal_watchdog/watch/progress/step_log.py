"""Step lines in logs: ``StepLogTail`` follows log files from their end (AReaL re-uses logs
across retries, so only new lines count) and reports step numbers, each with its line's own
timestamp where it has one, the phases AReaL announces (``PHASE_LINES``: the silence counts
anew from them, as from an announced pause's start) and AReaL's own phase timings
(``StepPhases``); only files the job's own user could have written count
(``trusted_log_problem``)."""

from __future__ import annotations

import getpass
import glob
import os
import pwd
import re
import stat as stat_module
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import regex

from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.secure import run_dir_owner

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
LINE_BUDGET_S = 0.05  # the longest one log line may take to match watchdog.step_regex
# AReaL's StatsLogger table after each step: "│ timeperf/rollout │ 4.5e+01 │ ..."
PHASE_TIME = re.compile(
    r"timeperf/(?P<phase>[\w/]+)\s*│\s*(?P<seconds>[-+]?[0-9.]+(?:[eE][-+]?\d+)?)"
)
# The timestamp AReaL's logger puts on every line (``(AReaL) 20260829-00:00:00.000 StatsLogger``):
# step intervals to the millisecond, whatever the poll's resolution.
LINE_STAMP = re.compile(r"\(AReaL\) (\d{8}-\d\d:\d\d:\d\d\.\d{3}) ")
STAMPS_KEPT = 64  # the newest steps whose line's own timestamp is kept
# The few lines AReaL 1.0.4 and 2.0.0 print around a long silent phase (read in both releases):
# a phase that starts, or one that ended and lets the next begin. AReaL prints nothing when an
# FSDP save, an evaluation or an xccl weight update starts (docs/areal.md).
PHASE_LINES = (
    (re.compile(r"Saving HF checkpoint to \S+"), "saving an HF checkpoint (Archon)"),
    (re.compile(r"Scheduled async checkpoint save #\d+"), "an async checkpoint save (Megatron)"),
    (re.compile(r"Waiting for \d+ pending async checkpoint save"), "async checkpoint saves"),
    (re.compile(r"Saved recover checkpoint to \S+"), "the recover checkpoint saved"),
    (re.compile(r"Loading recover info from \S+"), "loading the recover checkpoint"),
    (re.compile(r"Loading weights from disk done in"), "weights loaded from disk"),
)


def find_progress(line: str, pattern: regex.Pattern[str]) -> tuple[int | None, int | None]:
    """The step number on a log line (ANSI colours stripped; the last match wins) and, when the
    line says it (``Train step 3/233``), the job's total (None when absent).

    The match runs in the ``regex`` engine with a time budget per line: a pattern that
    backtracks catastrophically raises TimeoutError instead of pinning the sidecar's CPU."""
    last = None
    for match in pattern.finditer(ANSI_ESCAPE.sub("", line), timeout=LINE_BUDGET_S):
        last = match
    if last is None:
        return None, None
    groups = last.groupdict()
    return _number(groups.get("step") or last.group(1)), _number(groups.get("total"))


def _number(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


@dataclass
class _Cursor:
    inode: int
    offset: int
    partial: bytes = b""


GLOB_EVERY = 10  # polls between two matchings of the log patterns, once a file matched


class StepLogTail:
    """Follow every file matching the glob patterns and return the step numbers of new lines.

    Only files the job's own user could have written count (``trusted_log``): under a shared
    fileroot like ``/tmp`` another user could otherwise print "step 1007" and mask a hang."""

    def __init__(self, patterns: list[str], step_regex: str, owner: int | None = None) -> None:
        self.patterns = patterns
        self.regex = regex.compile(step_regex)
        self.owner = os.geteuid() if owner is None else owner
        self.slow_lines = 0  # lines skipped because the pattern took over LINE_BUDGET_S
        self.cursors: dict[str, _Cursor] = {}
        self.refused: dict[str, str] = {}  # path -> why its lines do not count
        self.phases = StepPhases()
        self.total: int | None = None  # the job's last step, as the last step line said
        self.stamps: dict[int, float] = {}  # step -> its line's own timestamp, where it has one
        self.phase: str | None = None  # the newest phase AReaL announced since the last poll
        self._started = False
        self._polls = 0
        self._known: list[str] = []  # the paths the patterns matched at the last look

    def poll(self) -> list[int]:
        """Step numbers printed since the last call; files present at the first call start at
        their end, files that appear later are read from their start."""
        steps: list[int] = []
        self.phase = None
        for path in self._paths():
            try:
                stat = os.stat(path)
            except OSError:
                continue
            cursor = self.cursors.get(path)
            if cursor is None or cursor.inode != stat.st_ino:
                problem = trusted_log_problem(Path(path), self.owner)
                if problem:
                    self.refused[path] = problem
                    self.cursors.pop(path, None)
                    continue
                self.refused.pop(path, None)
            if cursor is None:
                start = stat.st_size if not self._started else 0
                cursor = self.cursors[path] = _Cursor(stat.st_ino, start)
            if cursor.inode != stat.st_ino or stat.st_size < cursor.offset:
                cursor.inode, cursor.offset, cursor.partial = stat.st_ino, 0, b""  # rotated
            if stat.st_size == cursor.offset:
                continue
            steps.extend(self._read_new(path, cursor))
        self._started = True
        return steps

    def _paths(self) -> list[str]:
        """The files to follow: the patterns are matched again every ``GLOB_EVERY`` polls, or
        every poll while they match nothing (a glob lists every directory on its way: five
        operations a poll on the shared filesystem for torchrun's log of rank 0)."""
        self._polls += 1
        if self._known and self._polls % GLOB_EVERY != 1:
            return self._known
        paths: set[str] = set()
        for pattern in self.patterns:
            paths.update(glob.glob(pattern, recursive=True))
        self._known = sorted(paths)
        return self._known

    def _read_new(self, path: str, cursor: _Cursor) -> list[int]:
        try:
            with open(path, "rb") as fh:
                fh.seek(cursor.offset)
                data = fh.read(4 * 1024 * 1024)
        except OSError:
            return []
        cursor.offset += len(data)
        data = cursor.partial + data
        lines = data.split(b"\n")
        cursor.partial = lines.pop()
        steps = []
        for raw in lines:
            try:
                step, total = find_progress(raw.decode("utf-8", errors="replace"), self.regex)
            except TimeoutError:
                self.slow_lines += 1
                continue
            if step is not None:
                steps.append(step)
                self.total = total
                self.phases.new_step()
                self._stamp(step, raw)
            else:
                self.phase = announced_phase(raw) or self.phase
            self.phases.read(raw)
        return steps

    def _stamp(self, step: int, raw: bytes) -> None:
        match = LINE_STAMP.search(ANSI_ESCAPE.sub("", raw.decode("utf-8", errors="replace")))
        if match is None:
            return
        try:
            stamp = datetime.strptime(match[1], "%Y%m%d-%H:%M:%S.%f").timestamp()
        except ValueError:
            return
        self.stamps[step] = stamp
        while len(self.stamps) > STAMPS_KEPT:
            del self.stamps[min(self.stamps)]


def announced_phase(raw: bytes) -> str | None:
    """The phase an AReaL log line announces (``PHASE_LINES``), for people; None for others."""
    if b"(AReaL)" not in raw:
        return None
    text = ANSI_ESCAPE.sub("", raw.decode("utf-8", errors="replace"))
    return next((name for pattern, name in PHASE_LINES if pattern.search(text)), None)


def trusted_log_problem(path: Path, owner: int) -> str | None:
    """Why another user could have written the lines of ``path``, or None: it must be a
    regular file (no symlink) of ``owner``'s in directories that only ``owner`` or root may
    change (a sticky directory like ``/tmp`` is fine above them)."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return exc.strerror
    if not stat_module.S_ISREG(info.st_mode):
        return "not a regular file (a symlink?)"
    if info.st_uid != owner:
        return f"owned by uid {info.st_uid}, not by the job's user"
    if info.st_mode & 0o022:
        return "writable by others"
    for directory in path.parents:
        try:
            dinfo = os.stat(directory)
        except OSError as exc:
            return f"{directory}: {exc.strerror}"
        if dinfo.st_uid not in (owner, 0):
            return f"{directory} is owned by uid {dinfo.st_uid}"
        if dinfo.st_mode & 0o022 and not dinfo.st_mode & stat_module.S_ISVTX:
            return f"{directory} is writable by others"
    return None


@dataclass
class StepPhases:
    """How long this job's steps take, phase by phase, as AReaL's own timings say
    (``timeperf/rollout``, ``timeperf/train_step``, ... in StatsLogger's table after each step):
    the history that tells a slow phase from a hang before the first interval is seen."""

    longest: dict[str, float] = field(default_factory=dict)  # phase -> its longest time
    longest_step: float = 0.0  # the longest step, all its phases summed
    current: float = 0.0

    def new_step(self) -> None:
        self.current = 0.0

    def read(self, raw: bytes) -> None:
        if b"timeperf/" not in raw:
            return
        text = ANSI_ESCAPE.sub("", raw.decode("utf-8", errors="replace"))
        for match in PHASE_TIME.finditer(text):
            seconds = float(match["seconds"])
            if not 0 <= seconds < 1e7:
                continue
            phase = match["phase"]
            self.longest[phase] = max(self.longest.get(phase, 0.0), seconds)
            self.current += seconds
            self.longest_step = max(self.longest_step, self.current)

    def describe(self) -> str:
        """``rollout 45 s, train_step 2 s``: the phases that weigh, longest first."""
        top = sorted(self.longest.items(), key=lambda item: -item[1])[:2]
        return ", ".join(f"{phase} {seconds:.0f} s" for phase, seconds in top)


def default_log_patterns(layout: RunLayout, info: LaunchInfo, first_node: str = "*") -> list[str]:
    """Where the step lines are: rank 0's torchrun log (on the job's first node, where global
    rank 0 runs: one file to follow, not one a node), and the file of AReaL's log directory
    for this trial that carries StatsLogger's line (``main.log`` from the single controller,
    ``trainer.log`` from SPMD's global rank 0; any ``*.log`` for a plain script). Only the
    launching user's directory (``<fileroot>/logs/<user>/...``, the user who owns the run
    directory), so that another user's files under the shared fileroot can never fake
    progress."""
    areal = Path(info.fileroot) / "logs" / _owner_name(layout) / info.experiment_name
    areal = areal / info.trial_name

    def rank0(node: str) -> str:
        return str(layout.torchrun_logs_dir / node / "*" / "attempt_*" / "0" / "std*.log")

    if info.step_logs:  # the backend's own (Ray's driver forwards the ranks' output)
        return [*info.step_logs, str(areal / "main.log")]
    if info.mode == "single_controller":
        return [str(areal / "main.log")]
    if info.mode == "spmd":  # on Slurm rank 0 runs on the first node after the servers'
        return [rank0("*"), str(areal / "trainer.log")]
    return [rank0(first_node), str(areal / "*.log")]


def _owner_name(layout: RunLayout) -> str:
    """The login name AReaL puts in its log path (``getpass.getuser()`` of the launcher)."""
    try:
        return pwd.getpwuid(run_dir_owner(layout.run_dir)).pw_name
    except KeyError:
        return getpass.getuser()
