"""The watchdog sidecar: one per node, a separate process beside the job's ranks.

``python -m areal_watchdog.watch.sidecar --run-dir RUN_DIR (--node NODE | --node-from-slurm)``

Every sidecar follows progress (step lines, heartbeats, pauses), watches its node's ranks,
publishes its node's status and answers evidence requests. The leader (see ``coordination``)
also decides: when the job stalls, a rank dies while others live on, a node vanishes, or the job
fails, it gathers evidence from every node, classifies it, writes one incident and hands the
report to the notifiers. Signals (SIGTERM, SIGINT, submitit's SIGUSR2) mean "the job is ending",
never a hang.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import read_json, write_json_atomic
from areal_watchdog.common.rankset import format_ranks
from areal_watchdog.common.redact import Redactor
from areal_watchdog.diagnose.classify import classify
from areal_watchdog.evidence.gather import GatherSettings
from areal_watchdog.evidence.gpu import GpuBackend, IdleTracker, NoGpu, open_backend
from areal_watchdog.evidence.model import MISSING, Evidence, RankEvidence
from areal_watchdog.launch.slurm.node import slurm_nodes
from areal_watchdog.notify.notifier import Notifier
from areal_watchdog.notify.sinks import SinkSpec
from areal_watchdog.report.build import (
    IncidentContext,
    build_report,
    new_incident_id,
    write_incident,
)
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.trajectory.format import complete_steps
from areal_watchdog.watch.coordination import Coordinator
from areal_watchdog.watch.node import NodeWatch
from areal_watchdog.watch.progress import (
    StallClock,
    StepLogTail,
    default_log_patterns,
    read_heartbeats,
)

NOTIFY_FINISH_TIMEOUT = 30.0  # seconds to finish sending before the rest waits in the spool
FLIGHT_RECORDER_TIMEOUT = 2.0  # seconds to wait for the ranks' Flight Recorder dumps
ROLLOUT_TIMEOUT = 2.0  # seconds to wait for asyncio task dumps and server probes
FOLLOWER_LINGER = 60.0  # seconds a finished follower keeps answering a leader that has not finished


@dataclass
class Sidecar:
    """The watchdog loop for one node."""

    info: LaunchInfo
    node: str
    nodes: list[str]
    job_id: str | None = None
    out: Any = sys.stdout
    incidents: list[Path] = field(default_factory=list)
    stall_reported: bool = False
    crash_reported: bool = False
    stopping: bool = False
    done: bool = False

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
        self.watch = NodeWatch(
            self.layout,
            self.info.run_id,
            self.node,
            self.info.nproc_per_node,
            self.log,
            gpu_backend=self.open_gpus(),
            gpus=IdleTracker(wd.gpu_idle_utilization, wd.gpu_spin_power_fraction),
        )
        self.coordinator = Coordinator(
            self.layout, self.info.run_id, self.node, self.nodes, wd.node_timeout
        )
        self.settings = GatherSettings(wd.stack_method, wd.dump_timeout)
        self.answered: set[str] = set()
        self.statuses: dict[str, dict[str, Any]] = {}
        self.last_said = ""
        self.first_gone_at: float | None = None
        self.exited_at: float | None = None
        self.cancelling = False
        self.last_fr_seconds = 0.0
        self.suspected = False  # "stall suspected" said for the current silence
        self.pause_said = 0.0  # the end of the announced pause already said

    # ----------------------------------------------------------------- output
    def say(self, message: str) -> None:
        """One status line on the terminal, only when something changed."""
        if message == self.last_said:
            return
        self.last_said = message
        print(f"[areal-watchdog {self.node}] {message}", file=self.out, flush=True)
        self.log(message)

    def log(self, message: str) -> None:
        """A line in this node's sidecar log file."""
        try:
            with open(
                self.layout.logs_dir / f"sidecar_{self.node}.log", "a", encoding="utf-8"
            ) as fh:
                fh.write(f"{time.strftime('%H:%M:%S')} {self.redactor.scrub(message)}\n")
        except OSError:
            pass

    def open_gpus(self) -> GpuBackend:
        wd = self.info.watchdog
        try:
            backend = open_backend(wd.gpu_backend, wd.gpu_recording)
        except Exception as exc:  # noqa: BLE001 - explain, then watch without GPUs
            print(
                f"[areal-watchdog {self.node}] GPU monitor {wd.gpu_backend} unavailable "
                f"({exc}); watching without GPU evidence",
                file=self.out,
                flush=True,
            )
            return NoGpu()
        self.log(f"GPU monitor: {backend.name}")
        return backend

    # ------------------------------------------------------------------- loop
    def run(self) -> int:
        """Watch until the job ends (or a signal says it is ending); return 0."""
        wd = self.info.watchdog
        threshold = "auto" if wd.stall_timeout is None else f"{wd.stall_timeout:g} s"
        self.say(
            f"watching run {self.info.run_id}: {self.info.world_size} ranks on "
            f"{len(self.nodes)} node(s), stall after {threshold} "
            f"(startup {wd.startup_timeout:g} s)"
        )
        while not self.done and not self.stopping:
            self.guarded_poll(time.time())
            if self.done:
                break
            wait = min(wd.poll_interval, max(0.01, self.clock.crossed_at() - time.time() + 0.01))
            time.sleep(wait)
        if self.stopping and not self.done:
            self.on_job_ending()
        self.notifier.close(timeout=NOTIFY_FINISH_TIMEOUT)
        return 0

    def guarded_poll(self, now: float) -> None:
        """A poll whose failure (a full disk, a deleted file, a bug) is logged, said once, and
        survived: a sidecar that dies leaves the job unwatched."""
        try:
            self.poll(now)
        except Exception as exc:  # noqa: BLE001 - the watchdog must outlive its own errors
            self.log("poll failed:\n" + traceback.format_exc())
            self.say(f"watchdog error, still watching: {type(exc).__name__}: {exc}")

    def poll(self, now: float) -> None:
        """One observation; the leader may write an incident."""
        self.observe_progress(now)
        self.watch.refresh(now)
        self.watch.sample_gpus(now)
        self.statuses = self.coordinator.refresh()
        self.answer_request()
        exited = self.exit_record(self.node) is not None
        if exited:
            self.exited_at = self.exited_at or time.monotonic()
            self.watch.all_gone()
        self.publish("exited" if exited else "watching")
        if self.coordinator.is_leader():
            self.lead(now)
        elif exited and (self.finished() or time.monotonic() - self.exited_at > FOLLOWER_LINGER):
            self.done = True

    def publish(self, state: str) -> None:
        self.coordinator.publish(
            {
                "state": state,
                "last_step": self.clock.last_step,
                "last_progress_at": self.clock.last_progress_at,
                "leader": self.coordinator.leader(),
                "gpus": len(self.watch.gpus.last),
                "gpu_quiet_since": self.watch.gpus.quiet_since,
                "job_id": self.job_id,
                "last_incident": str(self.incidents[-1]) if self.incidents else None,
                **self.watch.summary(),
            }
        )

    def observe_progress(self, now: float) -> None:
        steps = self.tail.poll()
        beats = read_heartbeats(self.layout, self.info.run_id)
        if beats.max_step is not None:
            steps.append(beats.max_step)
        progressed = [s for s in steps if self.clock.step(s, now)]
        if beats.pause_until > now:
            self.clock.hold(now)
            if beats.pause_until != self.pause_said:
                self.pause_said = beats.pause_until
                self.say(
                    f"pause announced ({beats.pause_reason or 'no reason given'}): "
                    f"stall detection suspended for up to {beats.pause_until - now:.0f} s"
                )
        if progressed:
            self.suspected = False
            if self.stall_reported:
                self.say(f"progress resumed at step {self.clock.last_step}")
                self.stall_reported = False
            elif self.clock.first_step_at == now and len(progressed) == len(steps):
                self.say(f"first step seen: step {self.clock.last_step}")
            else:
                self.say("steps progressing")

    def answer_request(self) -> None:
        """Send this node's evidence for a request we have not answered yet."""
        request = self.coordinator.current_request()
        if request is None or request["id"] in self.answered:
            return
        self.answered.add(request["id"])
        if request.get("by") == self.node:
            return  # the leader gathers its own node directly
        items, traces, _ = self.local_evidence()
        servers = self.watch.rollout(items, ROLLOUT_TIMEOUT)
        self.coordinator.answer(
            request["id"],
            {"ranks": [asdict(r) for r in items], "flight_records": traces, "servers": servers},
        )
        self.log(f"answered evidence request {request['id']} ({len(items)} ranks)")

    def local_evidence(self) -> tuple[list[RankEvidence], dict[str, dict[str, Any]], float]:
        """This node's ranks: stacks, then Flight Recorder traces (and the seconds they took)."""
        items = self.watch.evidence(self.settings)
        if not self.info.watchdog.flight_recorder:
            return items, {}, 0.0
        started = time.perf_counter()
        traces = self.watch.flight_records(FLIGHT_RECORDER_TIMEOUT)
        return items, traces, time.perf_counter() - started

    # ----------------------------------------------------------------- leader
    def lead(self, now: float) -> None:
        exits = self.exit_records()
        lost = self.coordinator.lost_nodes(finished=set(exits))
        if lost and not self.crash_reported:
            self.crash_reported = self.stall_reported = True  # one report for a lost node
            self.say(f"node(s) {', '.join(lost)} stopped answering: gathering evidence")
            self.incident("node_lost", now, lost=lost)
        if len(exits) + len(lost) >= len(self.nodes):
            self.finish(exits)
            return
        if self.cancelling or self.interrupted():
            return  # the job is being ended on purpose: exits are no failures
        alive = self.alive_ranks()
        gone = self.gone_ranks()
        if gone and alive and not self.crash_reported:
            self.first_gone_at = self.first_gone_at or now
            if now - self.first_gone_at >= self.info.watchdog.crash_grace:
                self.crash_reported = True
                self.incident("rank_exited", now)
        quiet_for = self.gpus_quiet_for(now)
        wd = self.info.watchdog
        if (
            self.clock.first_step_at is not None  # GPUs idle while models load is no hang
            and quiet_for >= wd.gpu_idle_timeout
            and self.clock.silent_for(now) >= wd.gpu_idle_timeout
            and not self.stall_reported
            and alive
        ):
            self.stall_reported = True
            self.say(
                f"every GPU idle or spinning for {quiet_for:.0f} s with no progress: "
                f"gathering stacks from {len(alive)} ranks"
            )
            self.incident("gpu_idle", now)
        silent, threshold = self.clock.silent_for(now), self.clock.threshold
        if alive and not self.stall_reported and not self.suspected and silent > threshold * 2 / 3:
            self.suspected = True
            self.say(f"no new step for {silent:.0f} s (threshold {threshold:g} s): stall suspected")
        if self.clock.stalled(now) and not self.stall_reported and alive:
            self.stall_reported = True
            self.say(
                f"no progress for {silent:.1f} s (threshold {threshold:g} s): stall, "
                f"gathering stacks from {len(alive)} ranks"
            )
            self.incident("stall", now)

    def gpus_quiet_for(self, now: float) -> float:
        """How long every GPU of the job, on every node that has GPUs, has done no work."""
        since = []
        if self.watch.gpus.last:
            since.append(self.watch.gpus.quiet_since)
        for node, status in self.statuses.items():
            if node != self.node and status.get("gpus"):
                since.append(status.get("gpu_quiet_since"))
        if not since or any(s is None for s in since):
            return 0.0
        return now - max(since)

    def alive_ranks(self) -> set[int]:
        ranks = set(self.watch.live)
        for node, status in self.statuses.items():
            if node != self.node:
                ranks |= {int(r) for r in status.get("ranks_alive", {})}
        return ranks

    def gone_ranks(self) -> set[int]:
        ranks = set(self.watch.gone)
        for node, status in self.statuses.items():
            if node != self.node:
                ranks |= set(status.get("ranks_gone", []))
        return ranks

    def exit_records(self) -> dict[str, dict[str, Any]]:
        """The nodes whose job ended, with their exit records."""
        return {n: r for n in self.nodes if (r := self.exit_record(n)) is not None}

    def interrupted(self) -> bool:
        """The user interrupted the launcher (Ctrl-C, SIGTERM, SIGHUP): an ending, no failure."""
        record = read_json(self.layout.interrupted_file)
        return isinstance(record, dict) and record.get("run_id") == self.info.run_id

    def cancelled(self) -> bool:
        """A sidecar asked for the job to be cancelled (``on_hang: cancel``)."""
        return isinstance(read_json(self.layout.cancel_file), dict)

    def exit_record(self, node: str) -> dict[str, Any] | None:
        record = read_json(self.layout.job_exit(node))
        if isinstance(record, dict) and record.get("run_id") == self.info.run_id:
            return record
        return None

    def finished(self) -> bool:
        record = read_json(self.layout.finished_file)
        return isinstance(record, dict) and record.get("run_id") == self.info.run_id

    def finish(self, exits: dict[str, dict[str, Any]]) -> None:
        """Every node's job ended (or its node was lost): report a failure once, then stop."""
        failed = {n: r["returncode"] for n, r in exits.items() if r.get("returncode") != 0}
        if failed and not self.cancelled() and not self.interrupted() and not self.crash_reported:
            self.crash_reported = True
            self.incident("job_failed", time.time(), job_failed=True)
        elif not failed:
            self.say(
                f"job completed (last step {self.clock.last_step}); "
                f"{len(self.incidents)} incident(s)"
            )
        write_json_atomic(
            self.layout.finished_file,
            {
                "run_id": self.info.run_id,
                "time": time.time(),
                "by": self.node,
                "incidents": [str(p) for p in self.incidents],
                "failed_nodes": sorted(failed),
            },
        )
        self.publish("finished")
        self.done = True

    def on_job_ending(self) -> None:
        """A signal arrived (Slurm is ending the job). Every sidecar that gets it says so in its
        status; peers that stay silent meanwhile are lost nodes. The first node still standing
        reports them (or a failed node) before leaving: there is no time to wait for
        ``node_timeout``, Slurm kills the step after its KillWait."""
        self.say("job ending (signal received)")
        self.publish("ending")  # first of all: peers must not take this node for lost
        if self.crash_reported or self.cancelling or self.cancelled() or self.finished():
            return
        if self.interrupted():
            return
        exits = self.exit_records()
        peers = [n for n in self.nodes if n != self.node and n not in exits]
        self.coordinator.refresh()
        before = {
            n: self.coordinator.seen[n].seq if n in self.coordinator.seen else None for n in peers
        }
        window = max(3.0, 3 * self.info.watchdog.poll_interval)
        deadline = time.monotonic() + window
        spoke: set[str] = set()
        while peers and time.monotonic() < deadline and len(spoke) < len(peers):
            time.sleep(min(0.25, self.info.watchdog.poll_interval))
            self.statuses = self.coordinator.refresh()
            spoke = {
                n
                for n in peers
                if (n in self.coordinator.seen and self.coordinator.seen[n].seq != before[n])
                or self.statuses.get(n, {}).get("state") in ("ending", "finished")
            }

        quiet = [n for n in peers if n not in spoke]
        standing = [n for n in self.nodes if n not in quiet]
        if standing[0] != self.node:
            return
        if quiet:
            self.crash_reported = True
            self.incident("node_lost", time.time(), lost=quiet)
        elif any(r.get("returncode") != 0 for r in exits.values()):
            self.finish(exits)

    # -------------------------------------------------------------- incidents
    def gather(self, trigger: str, lost: list[str]) -> Evidence:
        """Evidence from this node directly and from every other live node by request."""
        peers = [n for n in self.nodes if n != self.node and n not in lost]
        request_id = self.coordinator.request_evidence(trigger) if peers else ""
        self.answered.add(request_id)
        items, traces, self.last_fr_seconds = self.local_evidence()
        servers = self.watch.rollout(items, ROLLOUT_TIMEOUT)
        answers = (
            self.coordinator.collect(request_id, peers, self.info.watchdog.evidence_timeout)
            if peers
            else {}
        )
        for answer in answers.values():
            items += [Evidence.rank_from_dict(r) for r in answer.get("ranks", [])]
            traces.update(answer.get("flight_records") or {})
            servers += [s for s in answer.get("servers") or [] if s not in servers]
        known_nodes = {
            int(r): node
            for node, status in self.statuses.items()
            for r in [*status.get("ranks_alive", {}), *status.get("ranks_gone", [])]
        }
        seen = {r.rank for r in items}
        items += [
            RankEvidence(rank=r, node=known_nodes.get(r, ""), state=MISSING)
            for r in range(self.info.world_size)
            if r not in seen
        ]
        unanswered = sorted(set(peers) - set(answers)) + lost
        return Evidence(
            world_size=self.info.world_size,
            ranks=sorted(items, key=lambda r: r.rank),
            first_step_seen=self.clock.first_step_at is not None,
            unanswered_nodes=sorted(unanswered),
            lost_nodes=sorted(lost),
            flight_records=traces,
            servers=servers,
        )

    def incident(
        self, trigger: str, now: float, job_failed: bool = False, lost: list[str] | None = None
    ) -> Path | None:
        silence = trigger in ("stall", "gpu_idle")  # one report per silence, whichever first
        key = f"stall-step{self.clock.last_step}" if silence else trigger
        if not self.coordinator.claim(key):
            return None  # another leader already reports this event
        started = time.perf_counter()
        lost = lost or self.coordinator.lost_nodes(finished=set())
        evidence = self.gather(trigger, lost)
        evidence.job_failed = job_failed
        gathered = time.perf_counter()
        verdict = classify(evidence)
        timings = {
            "gather_s": round(gathered - started, 4),
            "flight_recorder_s": round(self.last_fr_seconds, 4),
            "classify_s": round(time.perf_counter() - gathered, 4),
        }
        hang_like = trigger in ("stall", "gpu_idle", "rank_exited", "node_lost")
        action = self.info.watchdog.on_hang if hang_like else "report"
        ctx = IncidentContext(
            backend=self.info.backend,
            run_id=self.info.run_id,
            run_dir=self.info.run_dir,
            world_size=self.info.world_size,
            nodes=self.nodes,
            experiment_name=self.info.experiment_name,
            trial_name=self.info.trial_name,
            job_id=self.job_id,
            detected_at=now,
            last_progress_at=self.clock.last_progress_at if self.clock.first_step_at else None,
            threshold_s=self.clock.threshold,
            last_step=self.clock.last_step,
            trigger=trigger,
            action=action,
            timings=timings,
            trajectory=self.last_dump(),
        )
        report = build_report(new_incident_id(verdict.category, now), verdict, evidence, ctx)
        path = write_incident(Path(self.info.run_dir), report, evidence, self.redactor)
        self.incidents.append(path)
        self.notifier.submit(report)
        culprits = format_ranks(verdict.culprit_ranks) or "none named"
        self.say(
            f"report written: {path / 'report.md'} -- {verdict.category}, culprit ranks "
            f"{culprits}: {self.redactor.scrub(verdict.summary)}"
        )
        if action == "cancel":
            self.cancel_job(report["incident_id"])
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
        """``on_hang: cancel``: record why, then end the job (the launcher, or scancel)."""
        self.cancelling = True
        write_json_atomic(
            self.layout.cancel_file,
            {"run_id": self.info.run_id, "incident_id": incident_id, "time": time.time()},
        )
        if self.job_id:
            self.say(f"on_hang=cancel: scancel {self.job_id}")
            subprocess.run(["scancel", self.job_id], check=False, capture_output=True)
        else:
            self.say("on_hang=cancel: asking the launcher to terminate the job")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m areal_watchdog.watch.sidecar", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--run-dir", required=True, type=Path)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--node", help="this node's name (single-node launches)")
    where.add_argument(
        "--node-from-slurm",
        action="store_true",
        help="take the node and the job's nodes from the Slurm environment",
    )
    args = parser.parse_args(argv)
    try:
        info = LaunchInfo.load(args.run_dir)
        if args.node_from_slurm:
            node, nodes = os.environ["SLURMD_NODENAME"], slurm_nodes()
            job_id = os.environ.get("SLURM_JOB_ID")
        else:
            node, nodes, job_id = args.node, info.nodes or [args.node], info.job_id
    except Exception as exc:  # noqa: BLE001 - the sidecar must explain, not crash
        print(f"[areal-watchdog] cannot start: {exc}", file=sys.stderr)
        return 2
    sidecar = Sidecar(info, node, nodes, job_id)

    def _stop(signum: int, _frame: object) -> None:
        sidecar.stopping = True

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
        signal.signal(sig, _stop)
    return sidecar.run()


if __name__ == "__main__":
    sys.exit(main())
