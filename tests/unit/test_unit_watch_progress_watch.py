"""How the sidecar follows progress (``watch.parts.progress_watch``): step lines, heartbeats, peers'
announced pauses, the job's last step, on a real ``Sidecar`` (no loop: ``ProgressWatch.observe``
with a fake clock). What users see: the lines said, and the stall clock they drive."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from areal_watchdog.common.atomic import write_json_atomic
from areal_watchdog.config.model import GpuSection, WatchdogSection
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import ENV_NODE
from areal_watchdog.rundir.progress.beats import beat_name
from areal_watchdog.watch.sidecar import Sidecar
from areal_watchdog.watch.silence.triggers import Reported


@pytest.fixture
def sidecar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sidecar:
    monkeypatch.setenv(ENV_NODE, "n1")
    log = tmp_path / "train.log"
    log.write_text("loading the model\n")
    log.chmod(0o600)
    wd = WatchdogSection(stall_timeout=30.0, gpu=GpuSection(backend="none"), log_files=[str(log)])
    info = LaunchInfo(
        run_id="r1", backend="local", run_dir=str(tmp_path), world_size=2, nodes=["n1", "n2"],
        nproc_per_node=1, experiment_name="e", trial_name="t", fileroot=str(tmp_path),
        watchdog=wd,
    )  # fmt: skip
    info.layout.logs_dir.mkdir(parents=True)
    write_json_atomic(info.layout.launch_file, info.to_dict())
    node = Sidecar(info, "n1", ["n1", "n2"], out=io.StringIO())
    node.progress.observe(0.0, leading=True, due=True)  # the log's old lines do not count
    return node


def lines(sidecar: Sidecar) -> list[str]:
    said = sidecar.voice.out.getvalue().split("\n")
    return [line.removeprefix("[areal-watchdog n1] ") for line in said]


def append(sidecar: Sidecar, text: str) -> None:
    with open(sidecar.info.watchdog.log_files[0], "a") as fh:
        fh.write(text)


def test_step_lines_move_the_clock_and_are_said_once_each_way(sidecar: Sidecar) -> None:
    append(sidecar, "step 1/10 loss=3.2\nstep 2/10 loss=3.1\n")
    sidecar.progress.observe(5.0, leading=True, due=True)
    append(sidecar, "step 3/10\n")
    sidecar.progress.observe(9.0, leading=True, due=True)
    assert lines(sidecar)[:2] == ["first step seen: step 1, then step 2", "steps progressing"]
    assert (sidecar.kit.clock.last_step, sidecar.kit.clock.total) == (3, 10)
    assert sidecar.kit.clock.last_progress_at == 9.0
    sidecar.progress.observe(12.0, leading=True, due=True)  # nothing new: the clock stays
    assert sidecar.kit.clock.last_progress_at == 9.0


def test_progress_after_a_reported_silence_is_said_and_ends_it(sidecar: Sidecar) -> None:
    append(sidecar, "step 1/10\n")
    sidecar.progress.observe(5.0, leading=True, due=True)
    sidecar.view.reported = Reported(silence=True, suspected=True)
    append(sidecar, "step 2/10\n")
    sidecar.progress.observe(50.0, leading=True, due=True)
    assert lines(sidecar)[1] == "progress resumed at step 2"
    assert sidecar.view.reported == Reported()  # the next silence is reported afresh


def test_a_heartbeat_and_a_peers_step_count_as_progress(sidecar: Sidecar) -> None:
    beats = sidecar.info.layout.heartbeats("n1")
    beats.mkdir(parents=True)
    (beats / beat_name(0, 4, "r1")).touch()
    (beats / beat_name(1, 99, "another-run")).touch()  # another run's beat: not ours
    sidecar.progress.observe(5.0, leading=True, due=True)
    assert sidecar.kit.clock.last_step == 4
    sidecar.view.statuses = {"n2": {"local_step": 6}}
    sidecar.progress.observe(7.0, leading=True, due=True)
    assert sidecar.kit.clock.last_step == 6 and sidecar.kit.clock.last_progress_at == 7.0


def test_a_peers_announced_pause_holds_the_clock_and_is_said_once(sidecar: Sidecar) -> None:
    sidecar.view.statuses = {"n2": {"pause_until": 100.0, "pause_reason": "saving a checkpoint"}}
    sidecar.progress.observe(40.0, leading=True, due=True)
    sidecar.progress.observe(41.0, leading=True, due=True)
    assert [line for line in lines(sidecar) if line] == [
        "pause announced (saving a checkpoint): stall detection suspended for up to 60 s"
    ]
    assert not sidecar.kit.clock.stalled(41.0 + 29.0)  # the silence counts from the pause


def test_the_last_step_turns_the_silence_into_teardown(sidecar: Sidecar) -> None:
    append(sidecar, "step 9/10\n")
    sidecar.progress.observe(5.0, leading=True, due=True)
    append(sidecar, "step 10/10\n")
    sidecar.progress.observe(6.0, leading=True, due=True)
    assert lines(sidecar)[1] == (
        "last step seen: step 10 of 10; the job's teardown counts as a hang after 300 s"
    )
    assert not sidecar.kit.clock.stalled(6.0 + 31.0)


def test_a_log_others_may_write_is_refused_and_said(sidecar: Sidecar) -> None:
    log = Path(sidecar.info.watchdog.log_files[0])
    new = log.with_name("new.log")  # a new file in its place (a rotation), any user may write
    new.write_text("step 1007\n")
    os.chmod(new, 0o666)
    os.replace(new, log)
    sidecar.progress.observe(5.0, leading=True, due=True)
    sidecar.progress.observe(6.0, leading=True, due=True)
    (line,) = [line for line in lines(sidecar) if line]
    assert line.endswith("do not count: writable by others (it could fake progress)")
    assert sidecar.kit.clock.last_step is None


def test_a_phase_areal_announces_starts_the_silence_anew(sidecar: Sidecar) -> None:
    append(sidecar, "step 1/10\nstep 2/10\n")
    sidecar.progress.observe(5.0, leading=True, due=True)
    append(sidecar, "(AReaL) 20261128-10:00:00.000 Recover INFO: Saved recover checkpoint to /c "
                    "(with_optim=True)\n")  # fmt: skip
    sidecar.progress.observe(40.0, leading=True, due=True)
    assert sidecar.kit.clock.last_step == 2 and sidecar.kit.clock.silent_for(41.0) == 1.0
    assert "AReaL announced the recover checkpoint saved: the silence counts from here" in lines(
        sidecar
    )
