"""Recording each step's rollout batch: the manifest beside each file tells what it holds and
its checksum, a batch a step changes in place is written as it was recorded (``copy=True``),
a tensor with grad is written as plain data, a broken disk warns once, and ``from_env`` reads
what ``areal-launch`` set. Files only under ``tmp_path``; torch on the CPU."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest
import torch

from areal_watchdog.trajectory import recorder as recorder_module
from areal_watchdog.trajectory.format import (
    ENV_CONFIG_HASH,
    ENV_DIR,
    ENV_DUMP_STEPS,
    ENV_MAX_KEEP,
    ENV_PIN_STEPS,
    read_manifest,
)
from areal_watchdog.trajectory.recorder import TrajectoryRecorder, describe_batch


def group(value: float = 1.0) -> dict[str, object]:
    return {
        "input_ids": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "rewards": torch.full((2,), value),
        "prompt_id": "p0",
    }


def recorder(directory: Path, **kw: object) -> TrajectoryRecorder:
    return TrajectoryRecorder(directory, beats=False, **kw)  # type: ignore[arg-type]


def test_describe_batch_lists_tensors_and_plain_values_by_group() -> None:
    assert describe_batch([group(), {"note": 3}]) == [
        {"group": 0, "name": "input_ids", "shape": [2, 3], "dtype": "int64", "bytes": 48},
        {"group": 0, "name": "rewards", "shape": [2], "dtype": "float32", "bytes": 8},
        {"group": 0, "name": "prompt_id", "type": "str"},
        {"group": 1, "name": "note", "type": "int"},
    ]


def test_the_manifest_checksum_and_size_are_those_of_the_file(tmp_path: Path) -> None:
    rec = recorder(tmp_path, dp_rank=1, dp_size=2, world_size=4, config_hash="h1")
    try:
        rec.record(3, [group(), group(2.0)])
        rec.flush(10)
    finally:
        rec.close(10)
    data = tmp_path / "step_000003_dp_1.pt"
    manifest = read_manifest(data)
    assert manifest is not None
    assert manifest["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
    assert manifest["bytes"] == data.stat().st_size
    assert (manifest["step"], manifest["dp_rank"], manifest["dp_size"]) == (3, 1, 2)
    assert (manifest["world_size"], manifest["config_hash"], manifest["groups"]) == (4, "h1", 2)
    assert rec.written == [3] and rec.disabled_reason is None


def test_with_copy_a_batch_changed_in_place_is_written_as_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    # the writer beats before it writes: holding the beat holds the write until the change
    monkeypatch.setattr(recorder_module, "heartbeat", lambda step: release.wait(10))
    rec = TrajectoryRecorder(tmp_path)
    batch = [group(1.0)]
    try:
        rec.record(2, batch, copy=True)
        batch[0]["rewards"].fill_(9.0)
    finally:
        release.set()
        rec.close(10)
    written = torch.load(tmp_path / "step_000002.pt", weights_only=True)
    assert written[0]["rewards"].tolist() == [1.0, 1.0]


def test_a_tensor_with_grad_is_written_as_plain_data(tmp_path: Path) -> None:
    rec = recorder(tmp_path)
    logits = torch.ones(2, 2, requires_grad=True) * 2  # part of an autograd graph
    try:
        rec.record(1, [{"logits": logits}])
    finally:
        rec.close(10)
    written = torch.load(tmp_path / "step_000001.pt", weights_only=True)
    assert not written[0]["logits"].requires_grad
    assert written[0]["logits"].tolist() == [[2.0, 2.0], [2.0, 2.0]]


def test_an_unwritable_directory_warns_once_and_records_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    rec = recorder(blocker / "dumps")  # a directory under a file cannot exist
    try:
        for step in range(3):
            rec.record(step, [group()])
    finally:
        rec.close(10)
    assert rec.written == [] and rec.disabled_reason is not None
    err = capsys.readouterr().err
    assert err.count("trajectory dumping disabled, training goes on") == 1


def test_from_env_is_off_without_a_directory_and_reads_every_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_DIR, raising=False)
    assert TrajectoryRecorder.from_env() is None
    monkeypatch.setenv(ENV_DIR, str(tmp_path / "dumps"))
    monkeypatch.setenv(ENV_MAX_KEEP, "")
    monkeypatch.setenv(ENV_PIN_STEPS, "2,5")
    monkeypatch.setenv(ENV_DUMP_STEPS, "5")
    monkeypatch.setenv(ENV_CONFIG_HASH, "abc")
    monkeypatch.setenv("WORLD_SIZE", "8")
    rec = TrajectoryRecorder.from_env(dp_rank=0, dp_size=2, beats=False)
    assert rec is not None
    try:
        assert (rec.max_keep, rec.pin_steps, rec.dump_steps) == (None, {2, 5}, {5})
        assert (rec.world_size, rec.dp_size, rec.config_hash) == (8, 2, "abc")
        rec.record(4, [group()])  # not a dump step
        rec.record(5, [group()])
    finally:
        rec.close(10)
    assert rec.written == [5]
