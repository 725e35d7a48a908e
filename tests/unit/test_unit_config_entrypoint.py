"""The training script a config names and how it is launched, and the debug environment every
rank gets. What users see: the script beside the config is the one run, wherever they launch
from; a missing one is a one-line error naming the config and ``launch.entrypoint``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from areal_watchdog.common.errors import ConfigError
from areal_watchdog.config.areal_side.entrypoint import launch_mode, resolve_entrypoint
from areal_watchdog.config.debug_env import DEFAULT_DEBUG_ENV, render_debug_env
from areal_watchdog.config.model import JobConfig
from areal_watchdog.config.validate import validate


def job(config_dir: Path, entrypoint: str, mode: str = "auto") -> JobConfig:
    raw = {
        "cluster": {"fileroot": str(config_dir / "root")},
        "launch": {"entrypoint": entrypoint, "python": sys.executable, "mode": mode},
    }
    return validate(str(config_dir / "config.yaml"), raw)


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory, apart from the config's folder."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def test_the_script_beside_the_config_wins_wherever_the_launch_runs(
    tmp_path: Path, elsewhere: Path
) -> None:
    (tmp_path / "train.py").write_text("print('beside')\n")
    (elsewhere / "train.py").write_text("print('cwd')\n")
    (elsewhere / "other.py").write_text("print('cwd only')\n")
    assert resolve_entrypoint(job(tmp_path, "train.py")) == str(tmp_path / "train.py")
    assert resolve_entrypoint(job(tmp_path, "other.py")) == str(elsewhere / "other.py")
    assert resolve_entrypoint(job(tmp_path, "my_pkg.train")) == "my_pkg.train"  # a module


def test_a_missing_script_names_the_config_and_the_key(tmp_path: Path, elsewhere: Path) -> None:
    with pytest.raises(ConfigError) as excinfo:
        resolve_entrypoint(job(tmp_path, "trian.py"))
    assert str(excinfo.value) == (
        f"{tmp_path / 'config.yaml'}: `launch.entrypoint`: no such file: trian.py "
        "(looked beside the config, then in the working directory)"
    )


def test_auto_runs_an_areal_script_as_a_single_controller(tmp_path: Path) -> None:
    (tmp_path / "areal_train.py").write_text("import os\nfrom areal import workflow\n")
    (tmp_path / "plain.py").write_text("import torch  # mentions areal only here\n")
    assert launch_mode(job(tmp_path, "areal_train.py")) == "single_controller"
    assert launch_mode(job(tmp_path, "plain.py")) == "torchrun"
    assert launch_mode(job(tmp_path, "areal_train.py", mode="spmd")) == "spmd"


def test_the_debug_environment_points_into_the_runs_watch_dir() -> None:
    env = render_debug_env(DEFAULT_DEBUG_ENV, "/runs/e/t/watchdog")
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/runs/e/t/watchdog/flight_recorder/rank_"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert not any("{watch_dir}" in value for value in env.values())
    assert "{watch_dir}" in DEFAULT_DEBUG_ENV["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]  # a template
