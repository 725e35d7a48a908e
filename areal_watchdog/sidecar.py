"""The watchdog sidecar: one per node, a separate process beside the job's ranks.

``python -m areal_watchdog.sidecar --run-dir RUN_DIR --node NODE``

Every poll it reads progress (step lines, heartbeats, pauses) and the ranks' liveness; when the
job stalls, a rank dies while others live on, or the job fails, it gathers evidence, classifies
it, writes one incident and hands the report to the notifiers. It exits when the job ends.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from areal_watchdog.atomic import read_json, write_json_atomic
from areal_watchdog.classify import classify
from areal_watchdog.discovery import RankProcess, discover
from areal_watchdog.dump_layout import complete_steps
from areal_watchdog.evidence import MISSING, Evidence, RankEvidence
from areal_watchdog.gather import GatherSettings, gather_node
from areal_watchdog.launch_info import LaunchInfo
from areal_watchdog.notifier import Notifier
from areal_watchdog.progress import StallClock, StepLogTail, default_log_patterns, read_heartbeats
from areal_watchdog.rankset import format_ranks
from areal_watchdog.redact import Redactor
from areal_watchdog.report import IncidentContext, build_report, new_incident_id, write_incident
from areal_watchdog.sinks import SinkSpec

DISCOVERY_EVERY = 10  # polls between full environment scans once all local ranks are known
STATUS_EVERY = 5.0  # seconds between node status file writes
NOTIFY_FINISH_TIMEOUT = 30.0  # seconds to finish sending before the rest waits in the spool
MIN_CPU_WINDOW = 0.2  # seconds of CPU accounting behind a utilisation figure


@dataclass
class _RankWatch:
    proc: RankProcess
    handle: psutil.Process
    last_cpu: float
    last_sample: float
    utilization: float | None = None


@dataclass
class Sidecar:
    """The watchdog loop for one node."""

    info: LaunchInfo
    node: str
    out: object = sys.stdout
    clock: StallClock = field(init=False)
    ranks: dict[int, _RankWatch] = field(default_factory=dict)
    gone: dict[int, RankProcess] = field(default_factory=dict)
    incidents: list[Path] = field(default_factory=list)
    stall_reported: bool = False
    crash_reported: bool = False
    stopping: bool = False
    cancelling: bool = False

    def __post_init__(self) -> None:
        wd = self.info.watchdog
        self.layout = self.info.layout
        self.clock = StallClock(
            wd.stall_timeout, wd.startup_timeout, wd.auto_factor, wd.auto_min_timeout
        )
        patterns = default_log_patterns(
            self.layout, self.info.fileroot, self.info.experiment_name, self.info.trial_name
        )
        self.tail = StepLogTail(patterns + list(wd.log_files), wd.step_regex)
        specs = [SinkSpec.from_dict(d) for d in wd.notify]
        self.notifier = Notifier(
            specs,
            self.layout.spool_dir,
            Redactor.from_environment(),
            self.log,
            wd.spool_retry_interval,
        )
        self.redactor = self.notifier.redactor
        self.polls = 0
        self.last_status_write = 0.0
        self.last_said = ""
        self.first_gone_at: float | None = None
        self.local_expected = self.info.nproc_per_node

    # ----------------------------------------------------------------- output
    def say(self, message: str) -> None:
        """One status line, only when something changed."""
        if message == self.last_said:
            return
        self.last_said = message
        print(f"[areal-watchdog {self.node}] {message}", file=self.out, flush=True)
        self.log(message)

    def log(self, message: str) -> None:
        """A line in the sidecar's log file only."""
        line = f"[areal-watchdog {self.node}] {message}"
        try:
            with open(
                self.layout.logs_dir / f"sidecar_{self.node}.log", "a", encoding="utf-8"
            ) as fh:
                fh.write(f"{time.strftime('%H:%M:%S')} {line}\n")
        except OSError:
            pass

    # ------------------------------------------------------------------- loop
    def run(self) -> int:
        """Watch until the job ends; return 0."""
        wd = self.info.watchdog
        self.say(
            f"watching run {self.info.run_id}: {self.info.world_size} ranks, stall after "
            f"{'auto' if wd.stall_timeout is None else f'{wd.stall_timeout:g} s'} "
            f"(startup {wd.startup_timeout:g} s)"
        )
        while not self.stopping:
            now = time.time()
            exit_record = read_json(self.layout.job_exit_file)
            if isinstance(exit_record, dict) and exit_record.get("run_id") == self.info.run_id:
                self.finish(int(exit_record.get("returncode", 1)))
                return 0
            self.poll(now)
            wait = min(wd.poll_interval, max(0.01, self.clock.crossed_at() - time.time() + 0.01))
            time.sleep(wait)
        self.say("job ending (signal received); watchdog stops")
        return 0

    def poll(self, now: float) -> None:
        """One observation; may write an incident."""
        self.polls += 1
        self.observe_progress(now)
        self.refresh_ranks(now)
        if self.cancelling:
            return
        if self.gone and self.ranks and not self.crash_reported:
            self.first_gone_at = self.first_gone_at or now
            if now - self.first_gone_at >= self.info.watchdog.crash_grace:
                self.crash_reported = True
                self.incident("rank_exited", now)
        if self.clock.stalled(now) and not self.stall_reported and self.ranks:
            self.stall_reported = True
            self.say(
                f"no progress for {self.clock.silent_for(now):.1f} s (threshold "
                f"{self.clock.threshold:g} s): stall, gathering stacks from "
                f"{len(self.ranks)} ranks"
            )
            self.incident("stall", now)
        if now - self.last_status_write >= STATUS_EVERY:
            self.write_status(now)

    def observe_progress(self, now: float) -> None:
        steps = self.tail.poll()
        beats = read_heartbeats(self.layout, self.info.run_id)
        if beats.max_step is not None:
            steps.append(beats.max_step)
        progressed = [s for s in steps if self.clock.step(s, now)]
        if beats.pause_until > now:
            self.clock.hold(now)
            self.say(
                f"pause announced ({beats.pause_reason or 'no reason given'}): "
                f"stall detection suspended for up to {beats.pause_until - now:.0f} s"
            )
        if progressed:
            if self.stall_reported:
                self.say(f"progress resumed at step {self.clock.last_step}")
                self.stall_reported = False
            elif self.clock.first_step_at == now and len(progressed) == len(steps):
                self.say(f"first step seen: step {self.clock.last_step}")
            else:
                self.say("steps progressing")

    def refresh_ranks(self, now: float, force: bool = False) -> None:
        """Find new rank processes (a full scan only now and then) and sample the known ones."""
        if force or len(self.ranks) < self.local_expected or self.polls % DISCOVERY_EVERY == 1:
            for rank, proc in discover(self.layout, self.info.run_id, self.node).items():
                if rank in self.gone and self.gone[rank].pid == proc.pid:
                    continue  # a zombie not yet reaped by torchrun
                if rank in self.ranks and self.ranks[rank].proc.pid == proc.pid:
                    self.ranks[rank].proc = proc  # the registration may have arrived since
                else:
                    try:
                        handle = psutil.Process(proc.pid)
                        cpu = sum(handle.cpu_times()[:2])
                    except psutil.Error:
                        continue
                    self.ranks[rank] = _RankWatch(proc, handle, cpu, now)
        for rank, watch in list(self.ranks.items()):
            try:
                if not watch.handle.is_running() or watch.handle.status() == psutil.STATUS_ZOMBIE:
                    raise psutil.NoSuchProcess(watch.proc.pid)
                cpu = sum(watch.handle.cpu_times()[:2])
            except psutil.Error:
                self.gone[rank] = watch.proc
                del self.ranks[rank]
                self.log(
                    f"rank {rank} (pid {watch.proc.pid}) exited; {len(self.ranks)} ranks alive"
                )
                continue
            elapsed = now - watch.last_sample
            if elapsed >= MIN_CPU_WINDOW:  # shorter windows give noisy utilisation
                watch.utilization = (cpu - watch.last_cpu) / elapsed
                watch.last_cpu, watch.last_sample = cpu, now

    # -------------------------------------------------------------- incidents
    def gather(self) -> Evidence:
        wd = self.info.watchdog
        self.refresh_ranks(time.time(), force=True)
        live = {r: w.proc for r, w in self.ranks.items()}
        cpu = {w.proc.pid: w.utilization for w in self.ranks.values() if w.utilization is not None}
        items = gather_node(
            self.layout,
            self.node,
            live,
            dict(self.gone),
            cpu,
            GatherSettings(wd.stack_method, wd.dump_timeout),
        )
        seen = {r.rank for r in items}
        items += [
            RankEvidence(rank=r, state=MISSING)
            for r in range(self.info.world_size)
            if r not in seen
        ]
        return Evidence(
            world_size=self.info.world_size,
            ranks=sorted(items, key=lambda r: r.rank),
            first_step_seen=self.clock.first_step_at is not None,
        )

    def incident(self, trigger: str, now: float, job_failed: bool = False) -> Path:
        started = time.perf_counter()
        evidence = self.gather()
        evidence.job_failed = job_failed
        gathered = time.perf_counter()
        verdict = classify(evidence)
        timings = {
            "gather_s": round(gathered - started, 4),
            "classify_s": round(time.perf_counter() - gathered, 4),
        }
        incident_id = new_incident_id(verdict.category, now)
        ctx = IncidentContext(
            backend=self.info.backend,
            run_id=self.info.run_id,
            run_dir=self.info.run_dir,
            world_size=self.info.world_size,
            nodes=self.info.nodes,
            experiment_name=self.info.experiment_name,
            trial_name=self.info.trial_name,
            job_id=self.info.job_id,
            detected_at=now,
            last_progress_at=self.clock.last_progress_at if self.clock.first_step_at else None,
            threshold_s=self.clock.threshold,
            last_step=self.clock.last_step,
            trigger=trigger,
            action=self.info.watchdog.on_hang if trigger != "job_failed" else "report",
            timings=timings,
            trajectory=self.last_dump(),
        )
        report = build_report(incident_id, verdict, evidence, ctx)
        path = write_incident(Path(self.info.run_dir), report, evidence, self.redactor)
        self.incidents.append(path)
        self.notifier.submit(report)
        culprits = format_ranks(verdict.culprit_ranks) or "none named"
        self.say(
            f"report written: {path / 'report.md'} -- {verdict.category}, culprit ranks "
            f"{culprits}: {self.redactor.scrub(verdict.summary)}"
        )
        if ctx.action == "cancel" and trigger != "job_failed":
            self.cancel_job(incident_id)
        return path

    def last_dump(self) -> dict[str, object] | None:
        """The newest completely dumped step, with the command that replays it."""
        if not self.info.trajectory_dir:
            return None
        steps = complete_steps(Path(self.info.trajectory_dir))
        if not steps:
            return None
        step = max(steps)
        return {
            "step": step,
            "files": [str(p) for p in steps[step]],
            "replay_command": f"areal-launch replay {shlex.quote(self.info.run_dir)} --step {step}",
        }

    def cancel_job(self, incident_id: str) -> None:
        """``on_hang: cancel``: ask the launcher to end the job, with the incident as reason."""
        write_json_atomic(
            self.layout.cancel_file,
            {"run_id": self.info.run_id, "incident_id": incident_id, "time": time.time()},
        )
        self.cancelling = True
        self.say("on_hang=cancel: asking the launcher to terminate the job")

    def finish(self, returncode: int) -> None:
        """The job's processes ended: report a failure once, then stop quietly."""
        self.refresh_ranks(time.time())
        cancelled = isinstance(read_json(self.layout.cancel_file), dict)
        for rank, watch in list(self.ranks.items()):  # anything left is gone by now
            self.gone[rank] = watch.proc
        self.ranks.clear()
        if returncode != 0 and not cancelled and not self.crash_reported:
            self.crash_reported = True
            self.incident("job_failed", time.time(), job_failed=True)
        elif returncode == 0:
            self.say(
                f"job completed (last step {self.clock.last_step}); "
                f"{len(self.incidents)} incident(s)"
            )
        self.write_status(time.time(), state="finished")
        self.notifier.close(timeout=NOTIFY_FINISH_TIMEOUT)

    def write_status(self, now: float, state: str = "watching") -> None:
        self.last_status_write = now
        status = {
            "run_id": self.info.run_id,
            "node": self.node,
            "time": now,
            "state": state,
            "last_step": self.clock.last_step,
            "last_progress_at": self.clock.last_progress_at,
            "ranks_alive": sorted(self.ranks),
            "ranks_gone": sorted(self.gone),
            "last_incident": str(self.incidents[-1]) if self.incidents else None,
        }
        try:
            self.layout.status_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.layout.node_status(self.node), status)
        except OSError:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m areal_watchdog.sidecar", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--node", required=True)
    args = parser.parse_args(argv)
    try:
        info = LaunchInfo.load(args.run_dir)
    except Exception as exc:  # noqa: BLE001 - the sidecar must explain, not crash
        print(f"[areal-watchdog] cannot start: {exc}", file=sys.stderr)
        return 2
    sidecar = Sidecar(info, args.node)

    def _stop(signum: int, _frame: object) -> None:
        sidecar.stopping = True

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
        signal.signal(sig, _stop)
    return sidecar.run()


if __name__ == "__main__":
    sys.exit(main())
