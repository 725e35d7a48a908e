"""Trajectory dumps: AReaL layout, atomic writes, rotation, disk trouble, integrity, re-sharding."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from areal_watchdog.cli import main
from areal_watchdog.trajectory import (
    DumpError,
    TrajectoryRecorder,
    load_global_batch,
    load_step_file,
    split_for_rank,
)
from areal_watchdog.trajectory.format import complete_steps, list_step_files, read_manifest


def areal_batch(groups: int = 2, size: int = 4, seqlen: int = 8, tag: int = 0) -> list[dict]:
    """A batch shaped like AReaL's proposal: one dict per prompt group."""
    batch = []
    for g in range(groups):
        batch.append(
            {
                "input_ids": torch.full((size, seqlen), tag * 100 + g, dtype=torch.int32),
                "loss_mask": torch.ones(size, seqlen, dtype=torch.int32),
                "logprobs": torch.randn(size, seqlen),
                "versions": torch.zeros(size, seqlen, dtype=torch.int32),
                "attention_mask": torch.ones(size, seqlen, dtype=torch.bool),
                "rewards": torch.rand(size),
                "prompt_id": f"p{tag}-{g}",
            }
        )
    return batch


def record(
    directory: Path, steps: range, dp_rank: int | None = None, dp_size: int = 1, **kw: object
) -> TrajectoryRecorder:
    recorder = TrajectoryRecorder(directory, dp_rank=dp_rank, dp_size=dp_size, **kw)
    for step in steps:
        recorder.record(step, areal_batch(tag=step * 10 + (dp_rank or 0)))
    recorder.close()
    return recorder


def test_layout_and_contents_follow_areal(tmp_path: Path) -> None:
    record(tmp_path, range(1, 3), dp_rank=0, dp_size=2, config_hash="abc")
    record(tmp_path / "single", range(7, 8))
    assert (tmp_path / "step_000001_dp_0.pt").exists()
    assert (tmp_path / "single" / "step_000007.pt").exists()
    # AReaL-style code: a plain, safe torch.load gives list[dict[str, Tensor]]
    data = torch.load(tmp_path / "step_000002_dp_0.pt", weights_only=True)
    assert isinstance(data, list) and len(data) == 2
    assert data[0]["input_ids"].dtype == torch.int32 and data[0]["input_ids"].shape == (4, 8)
    assert data[0]["attention_mask"].dtype == torch.bool
    assert data[0]["rewards"].shape == (4,) and data[0]["prompt_id"] == "p20-0"
    manifest = read_manifest(tmp_path / "step_000002_dp_0.pt")
    assert manifest["step"] == 2 and manifest["dp_size"] == 2 and manifest["config_hash"] == "abc"
    names = {(t["group"], t["name"]): t for t in manifest["tensors"]}
    assert names[(0, "logprobs")] == {
        "group": 0,
        "name": "logprobs",
        "shape": [4, 8],
        "dtype": "float32",
        "bytes": 128,
    }


def test_areal_written_file_loads_with_our_reader(tmp_path: Path) -> None:
    torch.save(areal_batch(groups=3), tmp_path / "step_000005.pt")  # AReaL's writer: no manifest
    groups = load_global_batch(tmp_path, 5)
    assert len(groups) == 3 and groups[2]["input_ids"][0, 0] == 2


def test_rotation_keeps_newest_and_pinned(tmp_path: Path) -> None:
    record(tmp_path, range(1, 11), dp_rank=0, max_keep=3, pin_steps=[2])
    assert sorted(complete_steps(tmp_path)) == [2, 8, 9, 10]


def test_dump_steps_restricts_what_is_written(tmp_path: Path) -> None:
    record(tmp_path, range(1, 8), max_keep=None, dump_steps=[3, 5])
    assert sorted(complete_steps(tmp_path)) == [3, 5]


def test_crash_mid_write_leaves_no_partial_file(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, torch
        from areal_watchdog.trajectory import TrajectoryRecorder
        rec = TrajectoryRecorder({str(tmp_path)!r}, max_keep=None)
        rec.record(1, [{{"x": torch.ones(1000)}}]); rec.flush()
        print("first done", flush=True)
        rec.record(2, [{{"x": torch.randn(200 * 2**20 // 4)}}])  # 200 MB
        print("writing", flush=True)
        rec.flush()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "first done"
        assert proc.stdout.readline().strip() == "writing"
        deadline = time.monotonic() + 30
        partial = []
        while not partial and time.monotonic() < deadline:  # kill it inside the write itself
            partial = list(tmp_path.glob(".step_000002.pt.*.tmp"))
            time.sleep(0.001)
        assert partial, "the 200 MB write never started"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finals = [p.name for _s, _dp, p in list_step_files(tmp_path)]
    assert "step_000002.pt" not in finals  # the half-written file never took the real name
    assert sorted(complete_steps(tmp_path)) == [1]
    assert load_step_file(tmp_path / "step_000001.pt")[0]["x"].shape == (1000,)


@pytest.fixture
def tiny_disk(tmp_path: Path):
    mount = tmp_path / "tiny"
    mount.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("needs root to mount a 1 MB tmpfs")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_full_disk_disables_dumping_and_training_goes_on(
    tiny_disk: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    recorder = TrajectoryRecorder(tiny_disk, max_keep=None)
    recorder.record(1, [{"x": torch.ones(10)}])
    recorder.flush()
    for step in range(2, 6):  # 2 MB each on a 1 MB disk: the first fails, the rest are skipped
        recorder.record(step, [{"x": torch.ones(512 * 1024)}])
    recorder.close()
    assert recorder.disabled_reason and "No space left" in recorder.disabled_reason
    assert sorted(complete_steps(tiny_disk)) == [1]
    assert not [p for p in tiny_disk.iterdir() if p.name.endswith(".tmp")]
    assert capfd.readouterr().err.count("trajectory dumping disabled") == 1


def test_unwritable_directory_disables_dumping(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    recorder = TrajectoryRecorder(blocker / "dumps")
    recorder.record(1, areal_batch())
    recorder.close()
    assert recorder.disabled_reason and "cannot create" in recorder.disabled_reason


def test_corrupted_truncated_and_missing_files_are_clear_errors(tmp_path: Path) -> None:
    record(tmp_path, range(1, 4), dp_rank=0, dp_size=2, max_keep=None)
    record(tmp_path, range(1, 4), dp_rank=1, dp_size=2, max_keep=None)
    target = tmp_path / "step_000001_dp_1.pt"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(DumpError, match=r"step_000001_dp_1\.pt: checksum mismatch"):
        load_global_batch(tmp_path, 1)
    truncated = tmp_path / "step_000002_dp_0.pt"
    truncated.write_bytes(truncated.read_bytes()[:100])
    with pytest.raises(DumpError, match=r"step_000002_dp_0\.pt: truncated \(100 bytes"):
        load_global_batch(tmp_path, 2)
    (tmp_path / "step_000003_dp_1.pt").unlink()
    with pytest.raises(DumpError, match=r"step 3 has 1 of 2 data-parallel files"):
        load_global_batch(tmp_path, 3)
    with pytest.raises(DumpError, match=r"no dump of step 9 \(available steps: 1-2\)"):
        load_global_batch(tmp_path, 9)
    (tmp_path / "step_000004.pt").write_bytes(b"garbage, not a torch archive")
    with pytest.raises(DumpError, match=r"step_000004\.pt: cannot be loaded"):
        load_global_batch(tmp_path, 4)


def test_unsafe_objects_are_refused_by_the_safe_loader(tmp_path: Path) -> None:
    torch.save(
        [{"x": torch.ones(2), "when": time.struct_time((2026,) + (1,) * 8)}],
        tmp_path / "step_000001.pt",
    )
    with pytest.raises(DumpError, match="--unsafe-load only if you trust"):
        load_global_batch(tmp_path, 1)
    assert load_global_batch(tmp_path, 1, unsafe=True)[0]["when"].tm_year == 2026


def test_resharding_from_four_to_two_and_one(tmp_path: Path) -> None:
    for dp in range(4):
        recorder = TrajectoryRecorder(tmp_path, dp_rank=dp, dp_size=4)
        recorder.record(1, areal_batch(groups=3, tag=dp))  # 12 groups, tags dp*100 + g
        recorder.close()
    groups = load_global_batch(tmp_path, 1)
    order = [int(g["input_ids"][0, 0]) for g in groups]
    assert order == [0, 1, 2, 100, 101, 102, 200, 201, 202, 300, 301, 302]
    halves = [split_for_rank(groups, r, 2) for r in range(2)]
    assert [len(h) for h in halves] == [6, 6]
    assert [int(g["input_ids"][0, 0]) for g in halves[1]] == order[6:]
    (single,) = [split_for_rank(groups, 0, 1)]
    assert len(single) == 12
    uneven = [len(split_for_rank(groups, r, 5)) for r in range(5)]
    assert uneven == [3, 3, 2, 2, 2] and sum(uneven) == 12


def test_replay_command_errors_are_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(tmp_path)]) == 2
    assert "not a run directory made by areal-launch" in capsys.readouterr().err
    run = tmp_path / "exp" / "t"
    (run / "watchdog").mkdir(parents=True)
    entry = Path(__file__).resolve().parents[1] / "examples" / "rl_demo" / "train.py"
    (run / "watchdog" / "launch_config.yaml").write_text(
        f"experiment_name: exp\ntrial_name: t\ncluster: {{fileroot: {tmp_path}}}\n"
        f"launch: {{entrypoint: {entry}, nproc_per_node: 1}}\nwatchdog: {{enabled: true}}\n"
    )
    assert main(["replay", str(run), "--dry-run"]) == 2
    assert "no complete trajectory dump" in capsys.readouterr().err
    record(run / "debug_trajectories", range(1, 3), dp_rank=0, dp_size=1)
    assert main(["replay", str(run), "--step", "7", "--dry-run"]) == 2
    assert "step(s) 7 not in the dump (complete steps: 1-2)" in capsys.readouterr().err
    bad = run / "debug_trajectories" / "step_000002_dp_0.pt"
    bad.write_bytes(bad.read_bytes()[:-10])
    assert main(["replay", str(run), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "cannot replay step 2" in err and "step_000002_dp_0.pt: truncated" in err
    assert "Traceback" not in err
    assert main(["replay", str(run), "--step", "1", "--nproc", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "replaying step(s) 1" in out and "AREAL_WATCHDOG_REPLAY_STEPS=1" in out
    assert f"run dir:   {tmp_path / 'exp' / 't_replay1'}" in out
    assert "--nproc-per-node 2" in out
    assert not (tmp_path / "exp" / "t_replay1").exists()


@pytest.mark.parametrize("tampered", ["[1, 2]", '"a string"', '{"dp_size": "x", "bytes": 1}'])
def test_a_tampered_manifest_names_its_file_and_spares_the_other_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tampered: str
) -> None:
    run = tiny_run(tmp_path, steps=range(1, 4))
    manifest = run / "debug_trajectories" / "step_000002_dp_0.manifest.json"
    manifest.write_text(tampered)
    assert main(["replay", str(run), "--step", "2", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert str(manifest) in err and "not a manifest" in err and "Traceback" not in err
    assert main(["replay", str(run), "--step", "3", "--dry-run"]) == 0  # the others still replay
    capsys.readouterr()
    assert main(["replay", str(run), "--from", "3", "--to", "1000000000000", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--to 1000000000000: past the newest dumped step 3" in err
    assert main(["replay", str(run), "--from", "3", "--dry-run"]) == 0
    assert "replaying step(s) 3" in capsys.readouterr().out


def tiny_run(tmp_path: Path, env: str = "", steps: range = range(1, 3)) -> Path:
    """A run directory as ``areal-launch`` leaves it, with ``steps`` dumped."""
    run = tmp_path / "exp" / "t"
    (run / "watchdog").mkdir(parents=True)
    entry = Path(__file__).resolve().parents[1] / "examples" / "rl_demo" / "train.py"
    (run / "watchdog" / "launch_config.yaml").write_text(
        f"experiment_name: exp\ntrial_name: t\ncluster: {{fileroot: {tmp_path}}}\n"
        f"launch: {{entrypoint: {entry}, nproc_per_node: 1{env}}}\nwatchdog: {{enabled: true}}\n"
    )
    record(run / "debug_trajectories", steps, dp_rank=0, dp_size=1)
    return run


def test_a_dump_the_safe_loader_refuses_is_one_line_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tiny_run(tmp_path)
    dumps = run / "debug_trajectories"
    recorder = TrajectoryRecorder(dumps, dp_rank=0, dp_size=1)
    recorder.record(3, [{"x": torch.ones(2), "when": time.struct_time((2026,) + (1,) * 8)}])
    recorder.close()
    assert main(["replay", str(run), "--step", "3"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "cannot replay step 3" in line and "--unsafe-load only if you trust" in line
    assert not (tmp_path / "exp" / "t_replay3").exists()  # nothing was launched
    assert main(["replay", str(run), "--step", "3", "--unsafe-load", "--dry-run"]) == 0


def test_a_copied_run_directory_replays_its_own_dumps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tiny_run(tmp_path)
    copy = tmp_path / "copied" / "t"
    shutil.copytree(run, copy)
    for path in (run / "debug_trajectories").iterdir():
        path.unlink()  # the original's dumps are gone: only the copy's may be read
    assert main(["replay", str(copy), "--step", "2", "--dry-run"]) == 0
    assert f"AREAL_WATCHDOG_REPLAY_DIR={copy / 'debug_trajectories'}" in capsys.readouterr().out


def test_a_secret_of_launch_env_is_never_stored_and_comes_back_from_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tiny_run(tmp_path, ", env: {WANDB_API_KEY: '[REDACTED]', PLAIN: visible}")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert main(["replay", str(run), "--dry-run"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "launch.env.WANDB_API_KEY is a secret and was not stored" in line
    assert "export WANDB_API_KEY" in line
    monkeypatch.setenv("WANDB_API_KEY", "wandb-secret-4242")
    assert main(["replay", str(run), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "WANDB_API_KEY=[REDACTED]" in out and "wandb-secret-4242" not in out
