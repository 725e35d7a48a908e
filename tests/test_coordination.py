"""How sidecars coordinate through the run directory, without processes: what each one reads
and writes per poll (constant in the number of nodes for a follower), who leads, how a silent
leader is replaced, and how an evidence request reaches the followers."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.watch.cluster.coordination import FIRST_STATUS_GRACE_S, Coordinator
from areal_watchdog.watch.cluster.status_keeper import StatusKeeper

NODES = [f"n{i}" for i in range(40)]


def launched(tmp_path: Path) -> RunLayout:
    """A run directory as a launch leaves it: its launch.json there."""
    layout = RunLayout(tmp_path / "run")
    layout.watch_dir.mkdir(parents=True)
    layout.launch_file.write_text("{}")
    return layout


def cluster(tmp_path: Path, timeout: float = 0.6) -> list[Coordinator]:
    layout = launched(tmp_path)
    return [Coordinator(layout, "r1", n, list(NODES), timeout) for n in NODES]


def tick(nodes: list[Coordinator], skip: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    for c in nodes:
        if c.node not in skip:
            c.refresh()
            c.publish({"state": "watching"})


def reads_of(
    coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch, closely: bool = True
) -> list[str]:
    """The statuses ``coordinator`` reads in one refresh."""
    read: list[str] = []
    original = coordinator.read_status

    def counting(node: str) -> dict | None:
        read.append(node)
        return original(node)

    monkeypatch.setattr(coordinator, "read_status", counting)
    coordinator.refresh(closely=closely)
    monkeypatch.undo()
    return read


def test_a_follower_reads_only_the_leader_and_writes_only_when_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = cluster(tmp_path)
    tick(nodes)
    follower = nodes[25]
    assert reads_of(follower, monkeypatch) == ["n0"]  # 1 read, whatever the number of nodes
    assert follower.publish({"state": "watching"}) is False  # not due yet
    assert follower.publish({"state": "exited"}, force=True) is True  # news goes out at once
    time.sleep(follower.interval)
    assert follower.publish({"state": "exited"}) is True


def test_the_leader_reads_every_node_once_per_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = cluster(tmp_path)
    tick(nodes)
    leader = nodes[0]
    time.sleep(leader.interval)
    started = time.monotonic()
    assert len(reads_of(leader, monkeypatch)) == len(NODES) - 1
    again = reads_of(leader, monkeypatch)
    share = (time.monotonic() - started) / leader.interval  # a loaded machine is slow here
    assert len(again) <= int((len(NODES) - 1) * share)  # only the share of the next interval


def test_the_leaders_look_is_spread_over_its_polls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Polling four times an interval, the leader reads about a quarter of the nodes a poll,
    and every node within each interval: no poll carries the whole look."""
    nodes = cluster(tmp_path, timeout=1.2)  # interval 0.4 s
    tick(nodes)
    leader = nodes[0]
    leader.refresh()
    rounds: list[list[str]] = []
    shares: list[float] = []  # of the interval since the last poll (a loaded machine oversleeps)
    before = time.monotonic()
    for _ in range(8):
        time.sleep(leader.interval / 4)
        for peer in nodes[1:]:  # alive: a loaded machine past two periods read them all as quiet
            peer.publish({"state": "watching"}, force=True)
        started = time.monotonic()
        rounds.append(reads_of(leader, monkeypatch))
        shares.append(min(started - before, leader.interval) / leader.interval)
        before = started
    spread = [(len(r), round(s, 2)) for r, s in zip(rounds, shares, strict=True)]
    assert all(n <= 39 * s + 3 for n, s in spread), spread  # a share a poll, not the whole look
    assert set(sum(rounds[4:], [])) == set(NODES[1:])  # the last interval's polls read all


def test_a_node_that_missed_two_periods_is_read_every_poll_until_named_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node killed just after the leader's read of it: its status is read every poll once
    it missed two periods (not once more a period), so it is named lost within a poll of
    ``node_timeout``."""
    nodes = cluster(tmp_path, timeout=1.2)  # interval 0.4 s
    tick(nodes)
    leader, dead = nodes[0], "n5"
    leader.refresh()
    seen_alive = time.monotonic()
    read_dead: list[bool] = []
    while not leader.lost_nodes(finished=set()):
        time.sleep(leader.interval / 4)
        tick(nodes[1:], skip={dead})
        quiet_for = time.monotonic() - seen_alive
        reads = reads_of(leader, monkeypatch)
        if quiet_for > leader.node_timeout - leader.interval + 0.05:
            read_dead.append(dead in reads)  # (the share a poll: the test above)
    assert leader.lost_nodes(finished=set()) == [dead]
    assert read_dead and all(read_dead), read_dead


def test_a_silent_leader_is_replaced_and_named_lost(tmp_path: Path) -> None:
    nodes = cluster(tmp_path, timeout=0.6)
    tick(nodes)
    deadline = time.monotonic() + 3
    while nodes[1].leader() != "n1" and time.monotonic() < deadline:
        tick(nodes, skip={"n0"})
        time.sleep(0.05)
    assert nodes[1].is_leader() and nodes[5].leader() == "n1"
    time.sleep(nodes[1].interval)
    tick(nodes, skip={"n0"})
    assert nodes[1].lost_nodes(finished=set()) == ["n0"]


def test_an_evidence_request_rides_in_the_leaders_status(tmp_path: Path) -> None:
    nodes = cluster(tmp_path)
    tick(nodes)
    request_id = nodes[0].request_evidence("stall")
    for follower in nodes[1:]:
        follower.refresh()
        request = follower.current_request()
        assert request is not None and request["id"] == request_id
        follower.answer(request_id, {"ranks": []})
    answers = nodes[0].collect(request_id, NODES[1:], timeout=5)
    assert sorted(answers) == sorted(NODES[1:])


def test_a_leader_waiting_for_answers_longer_than_the_node_timeout_stays_alive(
    tmp_path: Path,
) -> None:
    """A follower that has not answered yet (its py-spy is slow) must not take the waiting
    leader for lost: the leader goes on publishing while it collects."""
    nodes = cluster(tmp_path, timeout=0.3)
    tick(nodes)
    leader, follower = nodes[0], nodes[1]
    request_id = leader.request_evidence("stall")
    waiting = threading.Thread(target=leader.collect, args=(request_id, NODES[1:], 1.0))
    waiting.start()  # 3x the node timeout, no answer
    leaders = set()
    while waiting.is_alive():
        follower.refresh()
        leaders.add(follower.leader())
        time.sleep(0.05)
    assert leaders == {"n0"}


def leaders_seen(follower: Coordinator, seconds: float) -> set[str]:
    """The leaders ``follower`` names over ``seconds`` of polls reading the leader only when
    its own status is due, as a follower away from the stall threshold does."""
    leaders = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        follower.refresh(closely=False)
        follower.publish({"state": "watching"})
        leaders.add(follower.leader())
        time.sleep(0.02)
    return leaders


def test_a_leader_busy_in_one_step_longer_than_the_node_timeout_is_not_taken_for_lost(
    tmp_path: Path,
) -> None:
    """A leader 7 s in a report under load (``node_timeout: 3``) was reported lost by its
    follower: its status moves on from a thread while its loop is busy."""
    nodes = cluster(tmp_path, timeout=0.3)
    tick(nodes)
    leader, follower = nodes[0], nodes[1]
    with StatusKeeper(leader) as keeper, keeper.step():  # one step, 4x the node timeout
        assert leaders_seen(follower, 1.2) == {"n0"}


def test_a_leader_that_polls_publishes_what_it_sees_not_what_it_kept(tmp_path: Path) -> None:
    """Between short steps the thread writes nothing: the loop's own, fresh status goes out
    (a thread that wrote the last status whenever it was due left every step at none)."""
    nodes = cluster(tmp_path, timeout=0.3)
    tick(nodes)
    leader = nodes[0]
    first, began = leader.seq, time.monotonic()
    with StatusKeeper(leader) as keeper:
        for step in range(60):
            with keeper.step():
                leader.publish({"state": "watching", "last_step": step})
            time.sleep(0.02)
        periods = (time.monotonic() - began) / leader.interval
        time.sleep(leader.interval)
    assert leader.seq - first <= periods + 1  # a status a period, not one a poll
    assert nodes[1].read_status("n0")["last_step"] >= 50


def test_a_wedged_leader_falls_silent_and_is_replaced(tmp_path: Path) -> None:
    nodes = cluster(tmp_path, timeout=0.3)
    tick(nodes)
    leader, follower = nodes[0], nodes[1]
    with StatusKeeper(leader, wedged_after=0.3) as keeper, keeper.step():
        assert leaders_seen(follower, 1.2) == {"n0", "n1"}
    assert "n0" in follower.lost_nodes(finished=set())


def test_a_quiet_leader_is_read_every_poll_before_it_is_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Away from the stall threshold a follower reads the leader once a status period, but
    once the leader's status has not moved for all but one period, every poll: its verdict
    rests on a read a poll old, not a period old."""
    nodes = cluster(tmp_path, timeout=0.6)
    tick(nodes)
    follower = nodes[1]
    follower.publish({"state": "watching"}, force=True)
    assert reads_of(follower, monkeypatch, closely=False) == []  # not due, the leader moved
    time.sleep(follower.node_timeout - follower.interval)
    follower.publish({"state": "watching"}, force=True)
    assert reads_of(follower, monkeypatch, closely=False) == ["n0"]
    assert reads_of(follower, monkeypatch, closely=False) == ["n0"]


def test_a_status_never_makes_a_deleted_run_directory_again(tmp_path: Path) -> None:
    """The run directory deleted under a running job: a sidecar's status is not written (the
    sidecar says the directory is gone and stops judging), and nothing of it is made again."""
    nodes = cluster(tmp_path)
    tick(nodes)
    shutil.rmtree(tmp_path / "run")
    assert nodes[3].publish({"state": "watching"}, force=True) is False
    assert not (tmp_path / "run").exists()


def test_nodes_join_a_dynamic_job_when_they_publish(tmp_path: Path) -> None:
    """AReaL on Slurm: only the controller's host is known at launch."""
    layout = launched(tmp_path)
    leader = Coordinator(layout, "r1", "login", ["login"], 0.6, dynamic=True)
    worker = Coordinator(layout, "r1", "node7", ["login", "node7"], 0.6)
    leader.publish({"state": "watching"})
    worker.publish({"state": "watching"})
    leader.refresh()
    assert leader.nodes == ["login", "node7"] and worker.leader() == "login"


def test_a_node_that_joins_late_is_alive_not_lost(tmp_path: Path) -> None:
    """AReaL on Slurm submits a role's job long after the controller's sidecar started: the
    node that joins then is alive from its first status, not lost before the leader's scan
    reaches it (the resume that followed excluded it, and sbatch refused the job)."""
    layout = launched(tmp_path)
    leader = Coordinator(layout, "r1", "login", ["login"], 0.6, dynamic=True)
    others = [Coordinator(layout, "r1", f"node{i}", ["login", f"node{i}"], 0.6) for i in range(9)]
    leader.publish({"state": "watching"})
    started = time.monotonic()
    while time.monotonic() - started < 0.7:  # longer than the node timeout, polling often
        leader.refresh()
        time.sleep(0.01)
    for other in others:
        other.publish({"state": "watching"})
    while len(leader.nodes) == 1:  # each poll reads a small share of the nodes
        time.sleep(0.01)
        leader.refresh()
    assert len(leader.nodes) == 10 and leader.lost_nodes(finished=set()) == []


def test_a_peer_whose_sidecar_starts_late_is_not_lost_one_that_never_speaks_is(
    tmp_path: Path,
) -> None:
    """Each sidecar starts on its own node (a Ray actor's cold worker under load started one
    10 s behind the head's, and the head named that node lost before the first step): a peer
    that has never spoken is waited for FIRST_STATUS_GRACE_S, however short ``node_timeout``."""
    layout = launched(tmp_path)
    head = Coordinator(layout, "r1", "head", ["head", "late"], 0.6)
    head.publish({"state": "watching"})
    head.started_at -= 30  # the late node has not spoken for 50 node timeouts
    head.refresh()
    assert head.lost_nodes(finished=set()) == []
    Coordinator(layout, "r1", "late", ["head", "late"], 0.6).publish({"state": "watching"})
    head.read_all()
    assert head.lost_nodes(finished=set()) == [] and "late" in head.seen
    silent = Coordinator(layout, "r1", "head", ["head", "never"], 0.6)
    silent.started_at -= FIRST_STATUS_GRACE_S + 1
    silent.refresh()
    assert silent.lost_nodes(finished=set()) == ["never"]
