"""A rank is its whole process tree and what the kernel says of it, on real torchrun jobs: a
checkpoint copied by a child process and busy DataLoader workers are work (nobody is paged); a
rank waiting forever on a child that waits for an answer is a straggler whose report names the
child and where it waits; every rank blocked on a FUSE filesystem whose server stopped
answering is a storage stall naming the mount and the file, and nothing of the run is left once
the storage answers again."""

from __future__ import annotations

from pathlib import Path

import pytest
from recording import record_evidence

from conftest import FAST
from testkit.fuse_storage import FuseStorage, available
from testkit.launcher import Launcher, gone_within
from testkit.reports import suspected_looks

pytestmark = pytest.mark.slow

QUIET = [*FAST, "watchdog.on_hang=cancel", "launch.nproc_per_node=2", "demo.steps=6"]


def test_work_in_a_ranks_children_is_movement(launcher: Launcher) -> None:
    """Two phases of one job run 12 s past a 3 s threshold each: rank 0's checkpoint copied by
    a child process, then every rank's DataLoader worker busy on one long document. The job
    must finish, unpaged, and the looks must say that the children moved, in each phase."""
    result = launcher.run(
        [
            *QUIET,
            "demo.phases=child_checkpoint@3,loader_work@5",
            "demo.phase_time=12",
            "demo.phase_mb=60",
            "demo.eval_ranks=-1",
        ]  # fmt: skip
    )
    assert result.returncode == 0, result.output[-3000:]
    assert result.reports == [], [r["summary"] for r in result.reports]
    said = [line for r in suspected_looks(result.run_dir)
            for line in r.get("confirmation", {}).get("moved") or []]  # fmt: skip
    for moved in ("its child processes' included", "the child processes of rank"):
        assert any(moved in line for line in said), (moved, said, result.output[-3000:])


def test_a_rank_waiting_on_a_blocked_child_names_the_child(launcher: Launcher) -> None:
    result = launcher.run([*QUIET, "demo.hang=child_blocked", "demo.hang_rank=1"])
    (report,) = result.reports
    assert report["category"] == "straggler" and report["culprit_ranks"] == [1]
    assert "waits on its child pid" in report["summary"] and "read()" in report["summary"]
    (rank1,) = [r for r in report["ranks"] if r["rank"] == 1]
    (child,) = [c for c in rank1["children"] if c["command"].startswith("sh -c")]
    assert child["kernel_wait"]["syscall"] == "read" and child["parent_pid"] == rank1["pid"]
    assert rank1["kernel_waits"][0]["syscall"] == "wait4"
    markdown = (Path(report["files"]["incident_dir"]) / "report.md").read_text()
    assert "## What the processes wait on" in markdown and "started pid" in markdown


@pytest.mark.skipif(available() is not None, reason=str(available()))
def test_storage_that_stops_answering_is_a_storage_stall(
    launcher: Launcher, tmp_path: Path
) -> None:
    """Every rank reads its next 1 MB of a shard on a FUSE mount at every step; from step 5 on
    the server answers no read. Storage can answer again (a failover): the look is final once
    it has not for 60 s (NFS's own major timeout), before the hard limit. The report names the
    mount, its filesystem and the files; the cancel ends the ranks; once the storage answers
    again nothing of the run is left."""
    mount = tmp_path / "shards"
    storage = FuseStorage(mount, ranks=4, size_mb=16, freeze_at_mb=4)
    try:
        result = launcher.run(
            [
                *FAST,
                "+watchdog.cancel_after=120",
                "launch.nproc_per_node=4",
                "demo.hang=none",
                "demo.steps=10",
                f"demo.shard_dir={mount}",
            ]  # fmt: skip
        )
    finally:
        storage.close()
    # the storage answers again: the SIGKILL pending on the blocked ranks ends them (under
    # the suite's load, seconds later)
    left = gone_within(tmp_path, 60)
    assert left == [], [p.pid for p in left]
    assert result.returncode == 3, result.output[-3000:]
    (report,) = result.reports
    assert report["category"] == "storage_stall", report["summary"]
    assert report["culprit_ranks"] == [0, 1, 2, 3] and report["last_step"] == 4
    assert f"mounted at {mount}" in report["summary"] and "a fuse filesystem" in report["summary"]
    assert "read() on " + str(mount / "shard-") in report["summary"]
    assert "A cancel may not end them" in report["summary"]
    assert "blocked in the kernel on a file whose storage does not answer" in result.output
    waits = [r["kernel_waits"][0] for r in report["ranks"]]
    assert {(w["fstype"], w["mount"], w["syscall"]) for w in waits} == {
        ("fuse", str(mount), "read")
    }
    assert {w["state"] for w in waits} <= {"S", "D"}  # FUSE's reader sleeps, NFS's is in D
    log = (result.run_dir / "watchdog" / "logs").glob("sidecar_*.log")
    text = next(log).read_text()
    assert "report written" in text and "it may answer again (a failover)" in text
    assert report["confirmation"]["by"] == "evidence" and 60 <= report["stalled_for_s"] < 75
    record_evidence(report, "storage_stall_w4_r0-1-2-3--fuse-dead")


def test_a_retry_loop_flooding_its_log_is_no_work_and_the_hard_limit_ends_it(
    launcher: Launcher,
) -> None:
    """Rank 1 retries a refused service with no back-off and logs every failure (its stderr
    grows by 100s of KB a second); the others wait in all_reduce. Its log writes are no data:
    the second look (or the hard limit, 12 s) ends the job, never deferred for the flood, and
    the report quotes the repeated line."""
    result = launcher.run([*QUIET, "demo.hang=retry_flood", "demo.hang_rank=1",
                           "+watchdog.cancel_after=12"])  # fmt: skip
    assert result.returncode == 3, result.output[-3000:]
    (report,) = result.reports
    assert report["confirmation"]["by"] in ("second_look", "hard_limit"), report["summary"]
    assert report["category"] == "straggler" and report["culprit_ranks"] == [1]
    assert "Rank 1 writes the same line again and again" in report["summary"]
    assert "reward service unreachable (try" in report["summary"]
    assert "past the hard limit" not in result.output  # never deferred for the flood
