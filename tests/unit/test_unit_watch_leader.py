"""What the leading sidecar does each poll (``watch.parts.leader``) and how it sees the job end
(``watch.parts.job_end``), on a minimal node object holding the state ``Sidecar`` holds: a fake
clock (``now`` passed in), the run's records in a real run directory under tmp_path, a fake incident
desk. What users see: the lines said, the incidents opened (once), the final record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from areal_watchdog.common.atomic import write_json_atomic
from areal_watchdog.config.model import GpuSection, HangAction, WatchdogSection
from areal_watchdog.evidence.trigger import Trigger
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import ENV_RUN_ID
from areal_watchdog.rundir.sidecar_files.hang_request import HangRequest
from areal_watchdog.watch.parts.job_end import JobEnd
from areal_watchdog.watch.parts.leader import Leader
from areal_watchdog.watch.parts.shared import Collaborators, JobView
from areal_watchdog.watch.processes.in_flight_sensor import InFlightSensor
from areal_watchdog.watch.processes.server_call_sensor import ServerCallSensor
from areal_watchdog.watch.progress.stall_clock import StallClock

THRESHOLD = 30.0


@dataclass
class FakeIncidents:
    """The incident desk as the leader sees it: what it was asked to open and follow."""

    case: object | None = None
    cancelling: bool = False
    written: list[Path] = field(default_factory=list)
    suspected: list[Path] = field(default_factory=list)
    opened: list[tuple[Trigger, tuple[str, ...]]] = field(default_factory=list)
    follows: int = 0

    @property
    def escalation(self) -> FakeIncidents:  # the desk's escalation: its follows are counted
        return self

    def follow(self, statuses: dict, now: float) -> None:
        self.follows += 1

    def open(self, trigger: Trigger, statuses: dict, lost: tuple[str, ...] = ()) -> None:
        self.opened.append((trigger, tuple(lost)))


class FakeCoordinator:
    """Peers: which are silent, what their statuses say."""

    def __init__(self, silent: tuple[str, ...] = (), statuses: dict | None = None) -> None:
        self.silent, self.statuses, self.seen = list(silent), statuses or {}, {}

    def lost_nodes(self, finished: set[str]) -> list[str]:
        return [n for n in self.silent if n not in finished]

    def alive(self, node: str) -> bool:
        return node not in self.silent

    def read_all(self) -> dict[str, dict[str, Any]]:
        return self.statuses


class FakePublisher:
    """The node status as the job's end publishes it: the states, in order."""

    def __init__(self) -> None:
        self.published: list[str] = []

    def publish(self, state: str) -> None:
        self.published.append(state)


class Node:
    """The leader and the job's end wired as ``Sidecar`` wires them, on fakes: the lines said,
    the incidents opened, the states published."""

    def __init__(
        self, run_dir: Path, nodes: tuple[str, ...] = ("n1",), live: tuple[int, ...] = (0, 1),
        gone: tuple[int, ...] = (), done: tuple[int, ...] = (), run_id: str = "r1",
        coordinator: FakeCoordinator | None = None, **watchdog: Any,
    ) -> None:  # fmt: skip
        wd = WatchdogSection(stall_timeout=THRESHOLD, poll_interval=0.05, **watchdog)
        info = LaunchInfo(
            run_id=run_id, backend="local", run_dir=str(run_dir), world_size=len(live + gone),
            nodes=list(nodes), nproc_per_node=2, experiment_name="e", trial_name="t",
            fileroot=str(run_dir), watchdog=wd,
        )  # fmt: skip
        info.layout.watch_dir.mkdir(parents=True, exist_ok=True)
        watch = SimpleNamespace(
            live=dict.fromkeys(live), gone=dict.fromkeys(gone), workers={},
            gpus=SimpleNamespace(last=[], quiet_since=None), finished_ranks=lambda: set(done),
            servers_refusing=list, in_kernel_since=dict,
        )  # fmt: skip
        told: list[str] = []
        notifier = SimpleNamespace(told=told, ended_well=lambda: told.append("ended well"))
        self.lines: list[str] = []
        self.kit = Collaborators(
            info, "n1", list(nodes), None, StallClock(THRESHOLD, 60.0, started_at=0.0),
            watch, coordinator or FakeCoordinator(), FakeIncidents(), notifier,
            InFlightSensor(info.layout),  # it read nothing: no rank was asked
            ServerCallSensor(),  # nor any server
            self.lines.append, self.lines.append,
        )  # fmt: skip
        self.view = JobView()
        self.publisher = FakePublisher()
        self.job_end = JobEnd(self.kit, self.view, self.publisher)
        self.leader = Leader(self.kit, self.view, self.job_end)


def test_a_silence_is_suspected_then_opened_as_a_stall_once(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.kit.clock.step(3, 0.0)
    node.leader.lead(10.0)
    assert node.lines == [] and node.kit.incidents.opened == []
    node.leader.lead(21.0)  # past two thirds of the threshold
    node.leader.lead(22.0)
    assert node.lines == ["no new step for 21 s (threshold 30 s): stall suspected"]
    node.leader.lead(31.0)
    node.leader.lead(40.0)
    assert node.lines[1:] == [
        "no progress for 31.0 s (threshold 30 s): stall, gathering stacks from 2 ranks"
    ]
    assert node.kit.incidents.opened == [(Trigger.STALL, ())]
    assert node.kit.incidents.follows == 5  # the silence under way is followed at every poll


def test_the_ranks_and_processes_of_every_node_are_counted(tmp_path: Path) -> None:
    node = Node(tmp_path, nodes=("n1", "n2"))
    node.view.statuses = {"n2": {"ranks_alive": {"2": 11, "3": 12}, "workers_alive": ["rollout 0"]}}
    node.kit.clock.step(3, 0.0)
    node.leader.lead(31.0)
    assert node.lines[-1].endswith("gathering stacks from 4 ranks and 1 other processes")


def test_a_rank_gone_while_others_live_is_reported_after_the_crash_grace(tmp_path: Path) -> None:
    node = Node(tmp_path, live=(0,), gone=(1,))
    node.kit.clock.step(3, 10.0)
    node.leader.lead(10.5)  # first seen gone: the grace starts
    node.leader.lead(20.0)
    assert node.kit.incidents.opened == []
    node.leader.lead(21.0)
    node.leader.lead(22.0)
    assert node.kit.incidents.opened == [(Trigger.RANK_EXITED, ())]


def test_a_rank_that_returned_cleanly_while_a_peer_still_ends_is_no_failure(
    tmp_path: Path,
) -> None:
    """CI's saturated-vLLM run: rank 0 returned after the last step while rank 1 still joined
    its HTTP threads; that is a job ending, not a rank that left its peers."""
    for peer_done, opened in (([2], []), ([], [(Trigger.RANK_EXITED, ())])):
        node = Node(tmp_path, live=(1,), gone=(0,), done=(0,))
        node.view.statuses = {"n2": {"ranks_gone": [2], "ranks_done": peer_done}}
        node.kit.clock.step(3, 10.0)
        for now in (10.5, 21.0, 25.0):
            node.leader.lead(now)
        assert node.kit.incidents.opened == opened and node.lines == []


def test_exits_after_the_watchdogs_own_cancel_are_no_new_failure(tmp_path: Path) -> None:
    node = Node(tmp_path, live=(0,), gone=(1,))
    HangRequest("r1", "inc-1", HangAction.CANCEL, 1.0).write(node.kit.layout)
    node.kit.clock.step(3, 10.0)
    for now in (10.5, 21.0, 45.0):
        node.leader.lead(now)
    assert node.kit.incidents.opened == []


def test_a_silence_under_follow_is_left_once_the_user_interrupts(tmp_path: Path) -> None:
    """Ctrl-C reaches the ranks with the launcher: a second look due then would find them
    gone and post a crash (seen at the shipped defaults: rank_crashed, on_hang run)."""
    node = Node(tmp_path)
    node.kit.clock.step(3, 0.0)
    node.kit.incidents.case = object()  # a silence waits for its second look
    node.leader.lead(31.0)
    assert node.kit.incidents.follows == 1
    write_json_atomic(node.kit.layout.interrupted_file, {"run_id": "r1", "time": 31.5})
    node.leader.lead(32.0)
    assert node.kit.incidents.follows == 1


def test_a_silent_node_opens_an_incident_naming_it(tmp_path: Path) -> None:
    node = Node(tmp_path, nodes=("n1", "n2"), coordinator=FakeCoordinator(silent=("n2",)))
    node.kit.clock.step(3, 0.0)
    node.leader.lead(5.0)
    node.leader.lead(6.0)
    assert node.lines == ["node(s) n2 stopped answering: gathering evidence"]
    assert node.kit.incidents.opened == [(Trigger.NODE_SILENT, ("n2",))]


def test_a_server_a_peer_sees_refusing_opens_a_look_at_once_but_not_in_teardown(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path, nodes=("n1", "n2"))
    node.kit.clock.step(3, 0.0)
    node.view.statuses["n2"] = {"servers_refusing": ["127.0.0.1:30000"]}
    node.leader.lead(1.0)
    assert node.lines == ["inference server(s) 127.0.0.1:30000 refuse connections: gathering "
                          "evidence from 2 ranks"]  # fmt: skip
    assert node.kit.incidents.opened == [(Trigger.SERVER_REFUSED, ())]
    ending = Node(tmp_path, nodes=("n1", "n2"))
    ending.kit.clock.total = 3  # the last step was seen: the servers are being stopped
    ending.kit.clock.step(3, 0.0)
    ending.view.statuses["n2"] = {"servers_refusing": ["127.0.0.1:30000"]}
    ending.leader.lead(1.0)
    assert ending.kit.incidents.opened == []


def test_idle_gpus_open_an_incident_before_the_stall_threshold(tmp_path: Path) -> None:
    node = Node(tmp_path, gpu=GpuSection(idle_timeout=12.0))
    node.kit.watch.gpus = SimpleNamespace(last=[{"index": 0}], quiet_since=2.0)
    node.kit.clock.step(3, 0.0)
    node.leader.lead(13.0)
    assert node.kit.incidents.opened == []  # GPUs quiet for 11 s only
    node.leader.lead(15.0)
    assert node.kit.incidents.opened == [(Trigger.GPU_IDLE, ())]
    assert node.lines == [
        "every GPU idle or spinning for 13 s with no progress: gathering stacks from 2 ranks"
    ]


def test_a_new_silence_during_a_followed_case_is_seen_afresh_afterwards(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.kit.clock.step(3, 0.0)
    node.kit.incidents.case = object()  # a silence waits for its second look
    node.leader.lead(31.0)
    assert node.kit.incidents.opened == [] and node.view.reported.silence is False
    node.kit.incidents.case = None
    node.leader.lead(32.0)
    assert node.kit.incidents.opened == [(Trigger.STALL, ())]


def test_a_job_that_ends_well_is_recorded_as_finished(tmp_path: Path) -> None:
    node = Node(tmp_path, live=())
    node.kit.clock.step(7, 0.0)
    node.view.own_exit = {"returncode": 0}
    node.leader.lead(1.0)
    assert node.lines == ["job completed (last step 7); 0 incident(s)"]
    record = json.loads(node.kit.layout.finished_file.read_text())
    assert (record["run_id"], record["by"], record["failed_nodes"]) == ("r1", "n1", [])
    assert node.job_end.finished() and node.view.done and node.publisher.published == ["finished"]
    assert node.kit.incidents.opened == []
    assert node.kit.notifier.told == ["ended well"]  # incidents still open are resolved


def test_a_job_that_fails_on_a_peer_is_reported_then_finished(tmp_path: Path) -> None:
    node = Node(tmp_path, nodes=("n1", "n2"), live=())
    node.view.own_exit = {"returncode": 0}
    node.view.statuses = {"n2": {"state": "exited", "returncode": 3}}
    node.leader.lead(1.0)
    assert node.kit.incidents.opened == [(Trigger.JOB_FAILED, ())]
    assert json.loads(node.kit.layout.finished_file.read_text())["failed_nodes"] == ["n2"]
    assert not any(line.startswith("job completed") for line in node.lines)
    assert node.kit.notifier.told == []


def test_a_silent_peers_exit_record_is_read_from_its_file(tmp_path: Path) -> None:
    node = Node(
        tmp_path, nodes=("n1", "n2", "n3"), coordinator=FakeCoordinator(silent=("n2", "n3"))
    )
    node.kit.layout.job_exit_dir.mkdir(parents=True)
    write_json_atomic(node.kit.layout.job_exit("n2"), {"run_id": "r1", "returncode": 0})
    write_json_atomic(node.kit.layout.job_exit("n3"), {"run_id": "old-run", "returncode": 9})
    assert node.job_end.exit_records(read_silent=True) == {"n2": {"run_id": "r1", "returncode": 0}}


def test_the_end_signal_reports_a_failed_peer_before_leaving(tmp_path: Path) -> None:
    node = Node(
        tmp_path,
        nodes=("n1", "n2"),
        coordinator=FakeCoordinator(statuses={"n2": {"state": "exited", "returncode": 1}}),
    )
    node.job_end.on_job_ending()
    assert node.lines[0] == "job ending (signal received)"
    assert node.publisher.published == ["ending", "finished"]  # ending first: not taken for lost
    assert node.kit.incidents.opened == [(Trigger.JOB_FAILED, ())]
    assert node.view.reported.failure and node.view.done


def test_the_end_signal_after_a_cancel_reports_nothing(tmp_path: Path) -> None:
    node = Node(
        tmp_path,
        nodes=("n1", "n2"),
        coordinator=FakeCoordinator(statuses={"n2": {"state": "exited", "returncode": 1}}),
    )
    node.kit.incidents.cancelling = True
    node.job_end.on_job_ending()
    assert node.publisher.published == ["ending"] and node.kit.incidents.opened == []
    assert not node.kit.layout.finished_file.exists()


def test_an_orphaned_sidecar_ends_the_runs_remaining_processes(tmp_path: Path) -> None:
    run_id = f"unit-{uuid.uuid4().hex}"
    env = {**os.environ, ENV_RUN_ID: run_id}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        node = Node(tmp_path, run_id=run_id)
        node.job_end.orphaned()
        assert proc.wait(timeout=5) != 0  # killed
        assert node.lines == ["areal-launch is gone: ended the run's 1 remaining process(es)"]
    finally:
        proc.kill()
        proc.wait()
