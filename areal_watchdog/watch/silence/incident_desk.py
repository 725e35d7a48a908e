"""One incident, from trigger to notification: gather evidence from every node, classify it,
write the report, hand it to the notifiers and, with ``on_hang: cancel``, end the job.

The leading sidecar calls ``Incidents.open``; followers only answer evidence requests
(``local_evidence``). A claim in the run directory makes sure that two leaders never report the
same event twice.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from areal_watchdog.common.rankset import culprits_phrase
from areal_watchdog.common.secrets.redact import SECRET_NAME, Redactor
from areal_watchdog.config.model import HangAction
from areal_watchdog.diagnose.classify import classify, ended_cleanly
from areal_watchdog.evidence.gather import GatherSettings
from areal_watchdog.evidence.model import MISSING, Evidence, RankEvidence, plain
from areal_watchdog.evidence.trigger import SILENCES, Trigger
from areal_watchdog.notify.envelope import is_damage, is_warning
from areal_watchdog.notify.notifier import Notifier
from areal_watchdog.report.bound import split_ranks
from areal_watchdog.report.build import IncidentContext, build_report, new_incident_id
from areal_watchdog.report.write import prune_oldest, write_incident
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import INCIDENTS, SUSPECTED
from areal_watchdog.rundir.progress.history import History
from areal_watchdog.rundir.sidecar_files.hang_request import HangRequest
from areal_watchdog.trajectory.format import complete_steps
from areal_watchdog.watch.cluster.coordination import ENDED_STATES, Coordinator
from areal_watchdog.watch.cluster.scheduler import end_job
from areal_watchdog.watch.processes.node_watch import NodeWatch
from areal_watchdog.watch.progress.stall_clock import StallClock
from areal_watchdog.watch.silence.escalation import Escalation, summary_prefix
from areal_watchdog.watch.silence.stall_case import Look, StallCase
from areal_watchdog.watch.timelines.timeline_drawings import Drawings

# Seconds to wait for the ranks' Flight Recorder dumps: a rank spinning in Python lends its
# listener the GIL in 5 ms slices, and under load (AReaL's FSDP on 2 cores) 2 s was too short.
FLIGHT_RECORDER_TIMEOUT = 5.0
ROLLOUT_TIMEOUT = 2.0  # seconds to wait for asyncio task dumps and server probes
SUSPECTED_KEPT = 20  # the newest looks kept under suspected/ (a job slow at every step writes many)
HANG_TRIGGERS = (*SILENCES, Trigger.RANK_EXITED, Trigger.NODE_SILENT)


@dataclass
class LocalEvidence:
    """One node's share: its ranks and other processes, the ranks' Flight Recorder traces, the
    servers it probed."""

    ranks: list[RankEvidence]
    traces: dict[str, dict[str, Any]]
    servers: list[dict[str, Any]]
    workers: list[RankEvidence] = field(default_factory=list)
    flight_recorder_s: float = 0.0

    def to_answer(self) -> dict[str, Any]:
        return {
            "ranks": [plain(r) for r in self.ranks],
            "workers": [plain(w) for w in self.workers],
            "flight_records": self.traces,
            "servers": self.servers,
        }


def look_outcome(post: bool, confirmation: dict[str, Any] | None) -> str:
    """A look as the metrics count it: posted, damage (a warning that lasts), warning (a
    silence that moves without working: a possible livelock, a retry loop), dismissed
    (something moved) or written (a slow phase, or a verdict only time decides)."""
    report = {"confirmation": confirmation}
    if post and is_warning(report):
        return "damage" if is_damage(report) else "warning"
    if post:
        return "posted"
    return "dismissed" if (confirmation or {}).get("moved") else "written"


def job_secrets(pids: list[int]) -> list[str]:
    """The values of the job's secret-looking variables (``launch.env`` reaches the ranks, not
    the sidecar), read from the ranks' own environment: they are our processes."""
    found: list[str] = []
    for pid in pids:
        with contextlib.suppress(psutil.Error, OSError):
            env = psutil.Process(pid).environ()
            found += [v for k, v in env.items() if SECRET_NAME.search(k)]
    return found


def local_evidence(info: LaunchInfo, watch: NodeWatch, stepped: bool) -> LocalEvidence:
    """This node's processes: stacks (a running rank's sampled again once the job ``stepped``),
    then Flight Recorder traces, then rollout tasks and servers."""
    wd = info.watchdog
    settings = GatherSettings(wd.stack_method, wd.dump_timeout, sample_running=stepped)
    ranks = watch.evidence(settings)
    workers = watch.worker_evidence(settings)
    started = time.perf_counter()
    traces = watch.flight_records(FLIGHT_RECORDER_TIMEOUT) if wd.flight_recorder else {}
    took = time.perf_counter() - started
    servers = watch.rollout([*ranks, *workers], ROLLOUT_TIMEOUT)
    return LocalEvidence(ranks, traces, servers, workers, took)


def _with_owners(servers: list[dict[str, Any]], workers: list[RankEvidence]) -> list[dict]:
    """Each probed server once (several nodes may probe one server), with the node and pid of
    the process serving it, where known."""
    by_address = {w.address: w for w in workers if w.address}
    probes: dict[str, dict[str, Any]] = {}
    for probe in servers:
        probes.setdefault(str(probe.get("address")), probe)
    return [
        {**s, "node": w.node, "pid": w.pid} if (w := by_address.get(str(s.get("address")))) else s
        for s in probes.values()
    ]


@dataclass
class _Unwritten:
    """An incident waiting for disk space: its report and evidence."""

    report: dict[str, Any]
    evidence: Evidence
    redactor: Redactor
    by_node: dict[str, list[dict[str, Any]]]  # every rank's entry, when the report holds a few
    folder: str  # incidents, or suspected (not posted)
    history: dict[str, Any] | None = None  # what the timeline is drawn from (posted ones)


@dataclass
class Incidents:
    """The leader's incident desk for one run (how a silence escalates: its ``escalation``)."""

    info: LaunchInfo
    node: str
    nodes: list[str]
    job_id: str | None
    watch: NodeWatch
    coordinator: Coordinator
    clock: StallClock
    notifier: Notifier
    say: Callable[[str], None]
    answered: set[str] = field(default_factory=set)
    written: list[Path] = field(default_factory=list)  # incidents
    suspected: list[Path] = field(default_factory=list)  # looks not confirmed: not posted
    pending: list[_Unwritten] = field(default_factory=list)  # incidents the disk refused
    cancelling: bool = False
    history: History = field(default_factory=History)  # the timeline's steps and GPU samples
    drawings: Drawings | None = None  # the timelines being drawn
    look_outcomes: Counter[str] = field(default_factory=Counter)  # the metrics read them
    posted_kinds: Counter[str] = field(default_factory=Counter)  # posted incidents by category

    def __post_init__(self) -> None:
        self.escalation = Escalation(self.info.watchdog, self.clock, self.say, self)

    @property
    def case(self) -> StallCase | None:
        """The silence under follow, if any."""
        return self.escalation.case

    def open(self, trigger: Trigger, statuses: dict, lost: tuple[str, ...] = ()) -> None:
        """Gather, classify, write, notify and act on one event (once across all leaders). A
        silence becomes a case that ``escalation`` follows until a new step: it is posted (and
        ``on_hang`` run) only once proven, confirmed or past the hard limit."""
        if self.case is not None and trigger is not Trigger.JOB_FAILED:
            return  # the silence under follow is this one
        self.escalation.case = None  # a job that ended failing: its failure is the story now
        silence = trigger in SILENCES  # one report per silence
        key = f"stall-step{self.clock.last_step}" if silence else trigger.value
        if not self.coordinator.claim(key):
            return  # another leader already reports this event
        look = self.look(trigger, lost, statuses)
        if silence and ended_cleanly(look.evidence):
            self.say("no new step, but every rank ended cleanly: the job is finishing, not hung")
            return
        action = self.info.watchdog.on_hang if trigger in HANG_TRIGGERS else HangAction.REPORT
        if not silence:
            self.report(trigger, look, action)
            return
        self.escalation.begin(StallCase(trigger, look.step, lost, action), look)

    def look(self, trigger: Trigger, lost: tuple[str, ...], statuses: dict) -> Look:
        """Evidence from every node, and the verdict on it."""
        at, started = time.time(), time.perf_counter()
        evidence, fr_seconds = self.gather(trigger, list(lost), statuses)
        evidence.job_failed = trigger is Trigger.JOB_FAILED
        gathered = time.perf_counter()
        verdict = classify(evidence)
        timings = {
            "gather_s": round(gathered - started, 4),
            "flight_recorder_s": round(fr_seconds, 4),
            "classify_s": round(time.perf_counter() - gathered, 4),
        }
        progress_at = self.clock.last_progress_at if self.clock.stepped else None
        return Look(
            evidence, verdict, timings, self.clock.last_step, at, progress_at, self.clock.threshold
        )

    def report(
        self,
        trigger: Trigger,
        look: Look,
        action: HangAction,
        confirmation: dict[str, Any] | None = None,
        post: bool = True,
    ) -> None:
        """Write, notify (when ``post``) and act on one look's verdict."""
        verdict = look.verdict
        ctx = self.context(trigger, look, action)
        ctx.folder = INCIDENTS if post else SUSPECTED
        report = build_report(
            new_incident_id(verdict.category, look.at), verdict, look.evidence, ctx
        )
        if confirmation is not None:
            report["confirmation"] = confirmation
            report["summary"] = summary_prefix(confirmation) + report["summary"]
        redactor = self.notifier.redactor.with_values(job_secrets(self.watch.pids()))
        report = redactor.scrub_tree(report)  # once, for the files and the messages alike
        report, by_node = split_ranks(report)
        if post:
            self.notifier.submit(report)  # first: a message needs no disk
            self.posted_kinds[verdict.category] += 1
        self.look_outcomes[look_outcome(post, confirmation)] += 1
        culprits = culprits_phrase(verdict.culprit_ranks, verdict.culprit_workers)
        verdict_line = f"{verdict.category}, {culprits}: {report['summary']}"
        history = self.history.to_dict() if post else None
        self.pending.append(
            _Unwritten(report, look.evidence, redactor, by_node, ctx.folder, history)
        )
        if not self.write_pending():
            self.say(f"verdict (report not on disk yet, retried every poll): {verdict_line}")
        if action.ends_job:  # whether or not the disk took the report
            self.cancel_job(report["incident_id"], action)

    def write_pending(self) -> bool:
        """Write the incidents that could not be written (and act on them); False while the
        disk still refuses. Called after each incident and on every poll."""
        while self.pending:
            item = self.pending[0]
            try:
                path = write_incident(Path(self.info.run_dir), item.report, item.evidence,
                                      item.redactor, item.by_node, item.folder,
                                      item.history)  # fmt: skip
            except OSError as exc:
                self.say(f"cannot write the incident report: {exc.strerror or exc}")
                return False
            self.pending.pop(0)
            posted = item.folder == INCIDENTS
            (self.written if posted else self.suspected).append(path)
            if posted and self.drawings is not None:
                self.drawings.start(path)
            if not posted:
                prune_oldest(path.parent, SUSPECTED_KEPT)
            report = item.report
            culprits = culprits_phrase(report["culprit_ranks"], report["culprit_workers"])
            what = "report written" if posted else "suspected look written (not posted)"
            self.say(
                f"{what}: {path / 'report.md'} -- {report['category']}, {culprits}: "
                f"{report['summary']}"
            )
        return True

    def gather(self, trigger: Trigger, lost: list[str], statuses: dict) -> tuple[Evidence, float]:
        """Evidence from this node directly and from every other live node by request. A node
        already silent for ``node_timeout`` (and not ending) is lost, not waited for: after a
        node was lost, every later report waited ``evidence_timeout`` for its answer."""
        ended = {n for n, status in statuses.items() if status.get("state") in ENDED_STATES}
        lost = [*lost, *(n for n in self.coordinator.lost_nodes(ended) if n not in lost)]
        peers = [n for n in self.nodes if n != self.node and n not in lost]
        request_id = self.coordinator.request_evidence(trigger.value) if peers else ""
        self.answered.add(request_id)
        mine = local_evidence(self.info, self.watch, self.clock.stepped)
        answers = self.collect(request_id, peers)
        ranks, workers, traces, servers = mine.ranks, mine.workers, mine.traces, mine.servers
        for answer in answers.values():
            ranks += [Evidence.rank_from_dict(r) for r in answer.get("ranks", [])]
            workers += [Evidence.rank_from_dict(w) for w in answer.get("workers", [])]
            traces.update(answer.get("flight_records") or {})
            servers += answer.get("servers") or []
        silent = set(peers) - set(answers)
        if silent:  # a node that did not answer and has fallen silent meanwhile is lost
            self.coordinator.read_all()
            lost = [*lost, *sorted(n for n in silent if not self.coordinator.alive(n))]
        ranks += self.missing_ranks(ranks, statuses, lost)
        evidence = Evidence(
            world_size=self.info.world_size,
            ranks=sorted(ranks, key=lambda r: -1 if r.rank is None else r.rank),
            first_step_seen=self.clock.stepped,
            unanswered_nodes=sorted(silent | set(lost)),
            lost_nodes=sorted(lost),
            flight_records=traces,
            servers=_with_owners(servers, workers),
            workers=workers,
        )
        return evidence, mine.flight_recorder_s

    def collect(self, request_id: str, peers: list[str]) -> dict[str, dict]:
        """The peers' answers within ``evidence_timeout``, and once more as long for the peers
        still alive that have not answered: a node busy with a wedged server's slow probes
        answered 2 s after the leader gave up (CI), and its ranks were reported missing."""
        if not peers:
            return {}
        timeout = self.info.watchdog.evidence_timeout
        answers = self.coordinator.collect(request_id, peers, timeout)
        self.coordinator.read_all()
        slow = [n for n in peers if n not in answers and self.coordinator.alive(n)]
        if slow:
            self.say(f"waiting up to {timeout:g} s more for {len(slow)} node(s) that are alive "
                     f"but have not answered: {', '.join(slow[:5])}")  # fmt: skip
            answers.update(self.coordinator.collect(request_id, slow, timeout))
        return answers

    def missing_ranks(
        self, seen: list[RankEvidence], statuses: dict, lost: list[str]
    ) -> list[RankEvidence]:
        """Ranks of the world size that no node gave evidence for, each on the node whose
        status last listed it; a rank no status listed, when one node was lost, was there (every
        node that answered said what it has: a node lost before its first status, as a Ray node
        whose raylet was killed soon after the start, named none)."""
        known_nodes = {
            int(r): node
            for node, status in statuses.items()
            for r in [*status.get("ranks_alive", {}), *status.get("ranks_gone", [])]
        }
        unknown = lost[0] if len(lost) == 1 else ""
        have = {r.rank for r in seen}
        return [
            RankEvidence(rank=r, node=known_nodes.get(r, unknown), state=MISSING)
            for r in range(self.info.world_size)
            if r not in have
        ]

    def context(self, trigger: Trigger, look: Look, action: HangAction) -> IncidentContext:
        return IncidentContext(
            backend=self.info.backend,
            run_id=self.info.run_id,
            run_dir=self.info.run_dir,
            world_size=self.info.world_size,
            nodes=self.nodes,
            experiment_name=self.info.experiment_name,
            trial_name=self.info.trial_name,
            job_id=self.job_id,
            detected_at=look.at,
            last_progress_at=look.progress_at,
            threshold_s=look.threshold,
            last_step=look.step,
            trigger=trigger.value,
            action=action,
            timings=look.timings,
            trajectory=self.last_dump(),
        )

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

    def cancel_job(self, incident_id: str, action: HangAction) -> None:
        """``on_hang: cancel`` (or ``resume``): record the request, then end the job (the
        scheduler's command, or the launcher through its pipe). Neither needs free disk: a full
        disk loses the record, not the cancel."""
        self.cancelling = True
        request = HangRequest(self.info.run_id, incident_id, action, time.time())
        try:
            request.write(self.info.layout)
        except OSError as exc:
            self.say(f"cannot record the cancel ({exc.strerror or exc}): cancelling anyway")
        if self.job_id and self.info.scheduler_command:
            self.say(f"on_hang={action}: {end_job(self.info, self.job_id, action)}")
            request.send_to_launcher()  # where a launcher gave a pipe, it hears it too
        else:
            self.say(f"on_hang={action}: asking the launcher to terminate the job")
            request.send_to_launcher()
