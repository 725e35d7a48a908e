"""How the watchdog knows the job is alive: step lines in logs, heartbeats, announced pauses.

``StepLogTail`` follows log files from their end (AReaL re-uses logs across retries, so only new
lines count) and reports step numbers; ``read_heartbeats`` reads the rank-side API's files;
``StallClock`` turns progress into a stall decision, with a learned (``auto``) threshold.
"""

from __future__ import annotations

import getpass
import glob
import os
import pwd
import re
import stat as stat_module
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import regex

from areal_watchdog.common.atomic import read_json
from areal_watchdog.rundir.beats import beat_step
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.pace import interval_summary
from areal_watchdog.rundir.secure import run_dir_owner

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
LINE_BUDGET_S = 0.05  # the longest one log line may take to match watchdog.step_regex
# AReaL's StatsLogger table after each step: "│ timeperf/rollout │ 4.5e+01 │ ..."
PHASE_TIME = re.compile(
    r"timeperf/(?P<phase>[\w/]+)\s*│\s*(?P<seconds>[-+]?[0-9.]+(?:[eE][-+]?\d+)?)"
)
LEARNED_FACTOR = 1.5  # a silence shorter than this many of the longest step seen is no stall
WARMUP_INTERVALS = 3  # step intervals seen before the threshold follows their distribution
WARMUP_MIN = 60.0  # the least threshold while warming up: first steps load, compile, warm caches
INTERVALS_KEPT = 256  # the newest step intervals the quantile is taken over


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
        self._started = False
        self._polls = 0
        self._known: list[str] = []  # the paths the patterns matched at the last look

    def poll(self) -> list[int]:
        """Step numbers printed since the last call; files present at the first call start at
        their end, files that appear later are read from their start."""
        steps: list[int] = []
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
            self.phases.read(raw)
        return steps


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


@dataclass
class HeartbeatState:
    """What the rank-side API says: the highest step and any pause still announced."""

    max_step: int | None = None
    pause_until: float = 0.0
    pause_reason: str = ""


def read_heartbeats(layout: RunLayout, run_id: str, node: str) -> HeartbeatState:
    """The heartbeats and announced pauses of ``node``'s ranks (``rundir.beats_node``; the
    other nodes' reach the leader through their sidecars' statuses): one listing, a pause file
    opened only when listed."""
    state = HeartbeatState()
    directory = layout.heartbeats(node)
    try:
        names = os.listdir(directory)
    except OSError:
        return state  # no rank of this node uses the heartbeat API
    steps = [s for s in (beat_step(n, run_id) for n in names) if s is not None]
    state.max_step = max(steps, default=None)
    for name in names:
        record = read_json(directory / name) if name.startswith("pause_") else None
        if isinstance(record, dict) and record.get("run_id") == run_id:
            until = float(record.get("until", 0))
            if until > state.pause_until:
                state.pause_until, state.pause_reason = until, str(record.get("reason", ""))
    return state


@dataclass
class StallClock:
    """Decide when the job stalled: no new step for the threshold, paused time excluded.

    ``stall_timeout=None`` means ``auto`` (the default): the threshold follows the job's own
    step intervals (``learned_threshold``). After the job's last step (``total``, when its step
    lines say it) the silence is its teardown: a stall after ``teardown_timeout`` at the least
    (saving, closing the process groups and servers outlast a step, and a resume would have
    nothing left to train).
    """

    stall_timeout: float | None
    startup_timeout: float
    auto_factor: float = 3.0
    auto_min_timeout: float = 5.0
    teardown_timeout: float = 300.0
    total: int | None = None  # the job's last step, once a step line said it
    started_at: float = field(default_factory=time.time)
    last_progress_at: float = 0.0
    last_step: int | None = None
    first_step_at: float | None = None
    max_interval: float = 0.0
    learned_step: float = 0.0  # the longest step the job's own timings report (StepPhases)
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=INTERVALS_KEPT))
    stats: dict[str, float | int | None] = field(default_factory=lambda: interval_summary([]))

    def __post_init__(self) -> None:
        self.last_progress_at = self.started_at

    def step(self, step: int, now: float) -> bool:
        """Record a step number; True when it is new progress (higher than any seen)."""
        if self.last_step is not None and step <= self.last_step:
            return False
        if self.first_step_at is None:
            self.first_step_at = now
        elif self.last_step is not None:
            self.max_interval = max(self.max_interval, now - self.last_progress_at)
            self.intervals.append(now - self.last_progress_at)
            self.stats = interval_summary(list(self.intervals))  # once a step, not once a read
        self.last_step = step
        self.last_progress_at = now
        return True

    def adopt(self, step: object, progress_at: object) -> None:
        """Take the leader's view of progress (a follower keeps it, to lead if it must)."""
        if not isinstance(step, int) or not isinstance(progress_at, (int, float)):
            return
        if self.last_step is None or step > self.last_step:
            self.last_step = step
            self.first_step_at = self.first_step_at or float(progress_at)
        self.last_progress_at = max(self.last_progress_at, float(progress_at))

    def hold(self, now: float) -> None:
        """An announced pause is in force: the silence so far does not count."""
        self.last_progress_at = max(self.last_progress_at, now)

    @property
    def tearing_down(self) -> bool:
        """The job's last step was seen: what is left is its teardown."""
        if self.total is None or self.last_step is None:
            return False
        return self.last_step >= self.total

    @property
    def threshold(self) -> float:
        if self.first_step_at is None:
            return self.startup_timeout
        if self.tearing_down:
            return max(self.teardown_timeout, self._stepping_threshold())
        return self._stepping_threshold()

    def _stepping_threshold(self) -> float:
        learned = LEARNED_FACTOR * self.learned_step
        if self.stall_timeout is not None:
            return max(self.stall_timeout, learned)
        if not self.intervals and not learned:  # the first step may have included start-up
            return max(self.startup_timeout, self.auto_min_timeout)
        return max(learned_threshold(self.stats, self.auto_factor, self.auto_min_timeout), learned)

    @property
    def learned(self) -> bool:
        """The threshold follows the job's own step intervals (``auto``, past the warm-up)."""
        return self.stall_timeout is None and len(self.intervals) >= WARMUP_INTERVALS

    def silent_for(self, now: float) -> float:
        return now - self.last_progress_at

    def stalled(self, now: float) -> bool:
        return self.silent_for(now) > self.threshold

    def crossed_at(self) -> float:
        """When the current silence crossed (or will cross) the threshold."""
        return self.last_progress_at + self.threshold


def learned_threshold(stats: dict[str, float | int | None], margin: float, floor: float) -> float:
    """``auto``: ``margin`` times the 99th percentile of the step intervals seen (the newest
    ``INTERVALS_KEPT``, summarised by ``interval_summary``), never below ``floor``. Until
    ``WARMUP_INTERVALS`` intervals are seen the first steps (loading, compiling, warming
    caches) get ``WARMUP_MIN`` at the least, or 5 times the longest interval."""
    if int(stats["intervals"] or 0) < WARMUP_INTERVALS:
        return max(WARMUP_MIN, 5 * float(stats["longest"] or 0.0))
    return max(floor, margin * float(stats["p99"] or 0.0))


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
