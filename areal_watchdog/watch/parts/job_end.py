"""How the job ends, as a sidecar sees it: which nodes' jobs exited and how, the final record
(``finished.json``), a signal that the job is ending (lost peers reported before leaving), and
a launcher gone (everything of the run ended). A part of the sidecar, handed what it reads
(``shared``) and the status it publishes."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from areal_watchdog.common.atomic import write_json_atomic
from areal_watchdog.evidence.trigger import Trigger
from areal_watchdog.rundir.run_id_check import read_run_record
from areal_watchdog.rundir.run_processes import kill_run_processes
from areal_watchdog.rundir.sidecar_files.hang_request import HangRequest
from areal_watchdog.rundir.sidecar_files.late_finish import LateFinish
from areal_watchdog.watch.cluster.scheduler import end_orphans
from areal_watchdog.watch.parts.shared import Collaborators, JobView
from areal_watchdog.watch.parts.status_publisher import StatusPublisher
from areal_watchdog.watch.timelines.late_finish import LATE_FINISH_LIMIT_S

# Seconds from the job's end (as this sidecar saw it) for its own drawings and sends; the
# launcher returns within 10 s of the job's end, whatever the sidecar still has to do.
EXIT_BUDGET_S = 4.0


class JobEnd:
    """The sidecar's part that sees the job end, and ends it where it must."""

    def __init__(self, kit: Collaborators, view: JobView, publisher: StatusPublisher) -> None:
        self.kit, self.view, self.publisher = kit, view, publisher

    def exit_records(self, read_silent: bool = False) -> dict[str, dict[str, Any]]:
        """The nodes whose job ended, with their exit records: ours, the others' as their
        status says; a silent node's (``read_silent``) or every node's from its file."""
        exits = {self.kit.node: self.view.own_exit} if self.view.own_exit else {}
        for node in self.kit.nodes:
            status = self.view.statuses.get(node, {})
            if node == self.kit.node:
                continue
            if status.get("state") in ("exited", "finished"):
                exits[node] = {"returncode": status.get("returncode")}
            elif (not read_silent or not self.kit.coordinator.alive(node)) and (
                record := self.exit_record(node)
            ) is not None:
                exits[node] = record
        return exits

    def exit_record(self, node: str) -> dict[str, Any] | None:
        return read_run_record(self.kit.layout.job_exit(node), self.kit.info.run_id)

    def finished(self) -> bool:
        return read_run_record(self.kit.layout.finished_file, self.kit.info.run_id) is not None

    def ending_on_purpose(self) -> bool:
        """Cancelled by the watchdog, or interrupted by the user: exits are no failures."""
        return (
            self.kit.incidents.cancelling
            or HangRequest.read(self.kit.layout) is not None
            or read_run_record(self.kit.layout.interrupted_file, self.kit.info.run_id) is not None
        )

    def finish(self) -> None:
        """Every node's job ended (or its node was lost): say how, record it, stop."""
        exits = self.exit_records()
        failed = sorted(n for n, r in exits.items() if r.get("returncode") != 0)
        written, suspected = self.kit.incidents.written, self.kit.incidents.suspected
        if not failed:
            looks = f", {len(suspected)} suspected look(s) not posted" if suspected else ""
            step = self.kit.clock.last_step
            last = "no step seen" if step is None else f"last step {step}"
            self.kit.say(f"job completed ({last}); {len(written)} incident(s){looks}")
            self.kit.notifier.ended_well()
        write_json_atomic(
            self.kit.layout.finished_file,
            {
                "run_id": self.kit.info.run_id,
                "time": time.time(),
                "by": self.kit.node,
                "incidents": [str(p) for p in written],
                "failed_nodes": failed,
            },
        )
        self.publisher.publish("finished")
        self.view.done = True

    def wind_down(self) -> None:
        """The job ended: the drawings and notifications still under way get until
        ``EXIT_BUDGET_S`` after the job's end (half a second when a signal ended us); what is
        left then goes on in a late finish, detached and bounded."""
        now = time.monotonic()
        budget = 0.5 if self.view.stopping else EXIT_BUDGET_S
        deadline = max((self.view.exited_at or now) + budget, now + 0.2)
        drawings = self.kit.incidents.drawings
        running = len(drawings.running) if drawings is not None else 0
        seen = self.view.exited_at
        since = f"{now - seen:.1f} s after the job's end was seen" if seen else "on a signal"
        self.kit.log(f"finishing {since}: {running} timeline(s) drawing, notifications until "
                 f"{deadline - now:.1f} s from now")  # fmt: skip
        redraw = drawings.settle(deadline) if drawings is not None else []
        pictures = self.kit.notifier.close(max(0.0, deadline - time.monotonic()))
        unsent = self.kit.notifier.unsent()
        if redraw or pictures or unsent:
            self.start_late_finish(redraw, [p.path.parent for p in pictures], unsent)
        else:
            took = time.monotonic() - now
            self.kit.log(f"finished {took:.1f} s later: nothing left to draw or send")

    def start_late_finish(self, redraw: list[Path], upload: list[Path], unsent: int) -> None:
        """Hand the rest to ``watch/timelines/late_finish.py``, recorded for ``areal-launch
        status``."""
        waiting = [f"drawing the timeline of {f.name}" for f in redraw]
        waiting += [f"uploading the timeline of {f.name}" for f in upload]
        waiting += [f"sending {unsent} notification(s) from the spool"] if unsent else []
        argv = [sys.executable, "-m", "areal_watchdog.watch.timelines.late_finish",
                "--run-dir", str(self.kit.layout.run_dir), "--node", self.kit.node]  # fmt: skip
        argv += [a for f in redraw for a in ("--draw", str(f))]
        argv += [a for f in upload for a in ("--upload", str(f))]
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            now = time.time()
            record = LateFinish(self.kit.info.run_id, self.kit.node, proc.pid, now,
                                now + LATE_FINISH_LIMIT_S + 5, tuple(waiting))  # fmt: skip
            record.write(self.kit.layout)
        except OSError as exc:
            self.kit.say(f"job over; left undone ({exc.strerror or exc}): {'; '.join(waiting)}")
            return
        self.kit.say(
            f"job over; a late finish (pid {proc.pid}, at most {LATE_FINISH_LIMIT_S:g} s) goes "
            f"on with: {'; '.join(waiting)}"
        )

    def on_job_ending(self) -> None:
        """A signal arrived (Slurm is ending the job). Every sidecar that gets it says so in its
        status; peers that stay silent meanwhile are lost nodes. The first node still standing
        reports them (or a failed node) before leaving: there is no time to wait for
        ``node_timeout``, Slurm kills the step after its KillWait."""
        self.kit.say("job ending (signal received)")
        self.publisher.publish("ending")  # first of all: peers must not take this node for lost
        self.view.statuses = self.kit.coordinator.read_all()
        if self.view.reported.failure or self.ending_on_purpose() or self.finished():
            return
        exits = self.exit_records()
        quiet = self.quiet_peers(
            [n for n in self.kit.nodes if n != self.kit.node and n not in exits]
        )
        standing = [n for n in self.kit.nodes if n not in quiet]
        if standing[0] != self.kit.node:
            return
        if quiet:
            self.view.reported = replace(self.view.reported, failure=True)
            self.kit.incidents.open(Trigger.NODE_SILENT, self.view.statuses, tuple(quiet))
        elif any(r.get("returncode") != 0 for r in exits.values()):
            self.view.reported = replace(self.view.reported, failure=True)
            self.kit.incidents.open(Trigger.JOB_FAILED, self.view.statuses)
            self.finish()

    def orphaned(self) -> None:
        """The launcher that started us is gone (``kill -9``, a closed terminal): nothing of
        the run may go on unsupervised. Torchrun stops its ranks when the launcher dies, but
        AReaL's workers outlive their controller: end every process of the run, and what the
        scheduler still runs for it (AReaL's Slurm jobs)."""
        killed = kill_run_processes(self.kit.info.run_id)
        ended = end_orphans(self.kit.info)
        self.kit.say(
            f"areal-launch is gone: ended the run's {len(killed)} remaining process(es)"
            + (f"; {ended}" if ended else "")
        )

    def quiet_peers(self, peers: list[str]) -> list[str]:
        """The peers that say nothing (no new status, not ending) within a few polls."""
        self.kit.coordinator.read_all()
        seen = self.kit.coordinator.seen
        before = {n: seen[n].seq if n in seen else None for n in peers}
        deadline = time.monotonic() + max(3.0, 3 * self.kit.info.watchdog.poll_interval)
        spoke: set[str] = set()
        while peers and time.monotonic() < deadline and len(spoke) < len(peers):
            time.sleep(min(0.25, self.kit.info.watchdog.poll_interval))
            self.view.statuses = self.kit.coordinator.read_all()
            spoke = {
                n
                for n in peers
                if (n in seen and seen[n].seq != before[n])
                or self.view.statuses.get(n, {}).get("state") in ("ending", "finished")
            }
        return [n for n in peers if n not in spoke]
