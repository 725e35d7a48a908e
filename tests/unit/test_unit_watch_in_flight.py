"""The cheap sensor between looks, on plain readings: when a collective all but a few ranks
share is past its limit (and when it is not: too many ranks outside it, a rank moving real
data, a GPU at work, a collective already passed), what the sensor learns of an operation's
length, and the trigger rule."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from test_triggers import HEALTHY

from areal_watchdog.evidence.listeners.collectives_in_flight import InFlight
from areal_watchdog.evidence.trigger import Trigger
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.watch.processes.in_flight_sensor import (
    IN_FLIGHT_MIN,
    InFlightSensor,
    Reading,
    stuck_for,
)
from areal_watchdog.watch.silence.triggers import Reported, decide

NOW = 1000.0


def reduce(since: float, seq: int = 7, op: str = "gloo:all_reduce") -> list[InFlight]:
    return [InFlight("0", seq, op, since)]


def limit(_op: str) -> float:
    return IN_FLIGHT_MIN


def test_every_rank_in_one_collective_past_its_limit_is_stuck() -> None:
    node0 = Reading(NOW, {0: reduce(NOW - 6), 1: reduce(NOW - 5)}, [], [])
    node1 = Reading(NOW, {2: reduce(NOW - 4), 3: reduce(NOW - 4)}, [], [])
    over, op = stuck_for([node0, node1], 4, NOW, limit)
    assert (round(over, 3), op) == (4 - IN_FLIGHT_MIN, "gloo:all_reduce")  # the last to issue it
    # the same sequence number with another operation: a mismatch, stuck the same
    node1 = Reading(NOW, {2: reduce(NOW - 4, op="gloo:broadcast"), 3: reduce(NOW - 4)}, [], [])
    assert stuck_for([node0, node1], 4, NOW, limit)[0] > 0


def test_all_but_a_few_in_one_collective_is_stuck_whatever_the_few_burn() -> None:
    """The early hangs: a rank that spins (answers with nothing in flight), one blocked in its
    loader or in a receive (point-to-point is left out), one stopped (no answer): CPU is no
    movement, so each of them is stuck past the limit, from the first step on."""
    both = {0: reduce(NOW - 9), 1: reduce(NOW - 9), 3: reduce(NOW - 9)}
    spinning = Reading(NOW, {**both, 2: []}, [], [])
    assert stuck_for([spinning], 4, NOW, limit)[0] > 0
    stopped = Reading(NOW, both, [2], [])
    assert stuck_for([stopped], 4, NOW, limit)[0] > 0
    # two of four outside it are more than a few
    assert stuck_for([Reading(NOW, {0: reduce(NOW - 9), 1: []}, [2, 3], [])], 4, NOW, limit)[
        0
    ] == float("-inf")
    # on two ranks, the one outside is the few
    assert stuck_for([Reading(NOW, {0: reduce(NOW - 9), 1: []}, [], [])], 2, NOW, limit)[0] > 0


def test_one_nodes_ranks_outside_while_every_other_node_waits_is_stuck() -> None:
    """A straggling node (its ranks spin) or a stopped one (they do not answer): more than a few
    ranks, but all of one node, while the other node's are all in the collective."""
    waiting = Reading(NOW, {0: reduce(NOW - 9), 1: reduce(NOW - 9)}, [], [])
    spinning = Reading(NOW, {2: [], 3: []}, [], [])
    assert stuck_for([waiting, spinning], 4, NOW, limit)[0] > 0
    assert stuck_for([waiting, Reading(NOW, {}, [2, 3], [])], 4, NOW, limit)[0] > 0
    # one rank of each node outside is neither few nor one node's
    split = [Reading(NOW, {0: reduce(NOW - 9), 1: []}, [], []),
             Reading(NOW, {2: reduce(NOW - 9), 3: []}, [], [])]  # fmt: skip
    assert stuck_for(split, 4, NOW, limit)[0] == float("-inf")


def test_a_rank_moving_data_a_working_gpu_or_a_passed_collective_is_not_stuck() -> None:
    both = {0: reduce(NOW - 9), 1: reduce(NOW - 9)}
    nothing = float("-inf")
    checkpoint = Reading(NOW, {**both, 2: []}, [], [2])  # rank 2 writes its checkpoint
    assert stuck_for([checkpoint], 3, NOW, limit)[0] == nothing
    gpu = Reading(NOW, {**both, 2: reduce(NOW - 9)}, [], [], gpu_busy=True)
    assert stuck_for([gpu], 3, NOW, limit)[0] == nothing
    ahead = Reading(NOW, {**both, 2: reduce(NOW - 9, seq=8)}, [], [])
    assert stuck_for([ahead], 3, NOW, limit)[0] == nothing
    young = Reading(NOW, {**both, 2: reduce(NOW - 1)}, [], [])
    assert stuck_for([young], 3, NOW, limit)[0] < 0
    unread = Reading(NOW, both, [], [])  # rank 2 not read at all: not covered
    assert stuck_for([unread], 3, NOW, limit)[0] == nothing


def test_an_operation_seen_in_flight_then_done_raises_its_own_limit(tmp_path: Path) -> None:
    sensor = InFlightSensor(RunLayout(tmp_path))
    sensor.learn(NOW, {0: reduce(NOW - 3), 1: reduce(NOW - 2)})
    sensor.learn(NOW + 1, {0: [], 1: reduce(NOW - 2)})  # rank 0's completed after 3 s at least
    assert sensor.limit("gloo:all_reduce") == 15.0 and sensor.limit("gloo:broadcast") == 2.0
    assert sensor.limit("gloo:broadcast", step=30.0) == 30.0  # never less than any step so far
    sensor.learn(NOW + 2, {0: []})  # rank 1 did not answer: nothing learned of it
    assert sensor.limit("gloo:all_reduce") == 15.0


def test_a_reading_survives_the_status_file_and_a_forged_one_is_none() -> None:
    reading = Reading(NOW, {0: reduce(NOW - 6)}, [1], [2], gpu_busy=True)
    assert Reading.from_dict(reading.to_dict()) == reading
    assert Reading.from_dict({"at": "x", "ranks": {}}) is None
    assert Reading.from_dict(None) is None


def test_the_sensor_looks_before_the_threshold_once_a_silence() -> None:
    stuck = replace(HEALTHY, silent_for=3.0, in_flight_over=0.5, in_flight_op="gloo:all_reduce")
    actions, reported = decide(stuck, Reported())
    assert [(a.trigger, a.op) for a in actions] == [(Trigger.IN_FLIGHT, "gloo:all_reduce")]
    assert decide(stuck, reported)[0] == []  # once a silence
    assert decide(replace(stuck, first_step_seen=False), Reported())[0] == []
    assert decide(stuck, Reported(failure=True))[0] == []  # a failure reported first wins
