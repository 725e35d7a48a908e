"""Trust at the shipped defaults (a config naming only ``on_hang: cancel``), on real 4-rank gloo
jobs: the silent phases every real job has are never paged, and a hang in the first step
intervals is posted in seconds, not at the warm-up's 60 s floor.

- rank 0 writes a checkpoint in fsync'd 1 MB chunks while the others wait in all_reduce: the
  second look finds its stack where it was but its own counters moving (busy, not hung);
- rank 0 uploads to a slow HTTP endpoint while the others wait: no byte through its read and
  write calls, but its TCP socket's acknowledged bytes move (busy, not hung);
- every rank evaluates on the CPU: no rank waits on another, a slow phase left to the hard
  limit (written, not posted);
- a rank that spins or whose loader never delivers at step 3: the sensor sees the others wait
  in one collective past any step so far and looks at once; the second look confirms.
"""

from __future__ import annotations

import pytest

from testkit.launcher import Launcher
from testkit.reports import suspected_looks
from testkit.slow_endpoint import SlowEndpoint

pytestmark = pytest.mark.slow

SHIPPED = [  # what a config naming only on_hang: cancel runs with
    "watchdog.stall_timeout=auto",
    "watchdog.poll_interval=1",
    "watchdog.startup_timeout=1800",
    "watchdog.on_hang=cancel",
    "launch.nproc_per_node=4",
]
# Past the warm-up (the threshold learned from 0.3 s steps: 5 s), 12 s each.
PHASE = ["demo.hang=none", "demo.steps=10", "demo.phase_time=12"]


def dismissed_by(looks: list[dict], moving: str) -> None:
    """Every look at the phase was dismissed, the first for rank 0's data moving (a look that
    straddles the phase's end may see the new step instead)."""
    assert looks, "no look at the phase: the row proves nothing"
    first = looks[0]["summary"]
    assert "rank 0 (pid" in first and moving in first, first
    for look in looks:
        assert moving in look["summary"] or "a new step" in look["summary"], look["summary"]


def test_a_silent_rank0_checkpoint_is_busy_not_hung(launcher: Launcher) -> None:
    result = launcher.run([*SHIPPED, *PHASE, "demo.phases=checkpoint@8", "demo.phase_mb=80"])
    assert result.returncode == 0, result.output[-3000:]
    assert result.reports == []
    dismissed_by(suspected_looks(result.run_dir), "read or wrote")


def test_an_upload_to_a_slow_endpoint_is_busy_not_hung(launcher: Launcher) -> None:
    endpoint = SlowEndpoint()
    try:
        result = launcher.run([*SHIPPED, *PHASE, "demo.phases=upload@8", "demo.phase_mb=12",
                               f"demo.phase_url={endpoint.url()}"])  # fmt: skip
    finally:
        endpoint.close()
    assert result.returncode == 0, result.output[-3000:]
    assert result.reports == []
    dismissed_by(suspected_looks(result.run_dir), "over TCP")


def test_every_rank_evaluating_on_the_cpu_is_a_slow_phase_never_posted(
    launcher: Launcher,
) -> None:
    result = launcher.run([*SHIPPED, *PHASE, "demo.phases=cpu_eval@8"])
    assert result.returncode == 0, result.output[-3000:]
    assert result.reports == []
    (look,) = suspected_looks(result.run_dir)
    assert look["category"] == "unknown" and look["confirmation"]["posted"] is False
    assert "no stack tells a slow phase from a hang" in result.output


@pytest.mark.parametrize("pattern", ["straggler", "dataloader_stall"])
def test_a_hang_at_step_3_is_posted_in_seconds_not_at_the_warm_up_floor(
    launcher: Launcher, pattern: str
) -> None:
    result = launcher.run(
        [*SHIPPED, f"demo.hang={pattern}", "demo.hang_step=3", "demo.hang_rank=2", "demo.steps=9"]
    )
    assert result.returncode == 3, result.output[-3000:]
    (report,) = result.reports
    assert (report["category"], report["culprit_ranks"]) == (pattern, [2])
    assert report["trigger"] == "collective_in_flight"
    assert report["stalled_for_s"] < 15, report["stalled_for_s"]
