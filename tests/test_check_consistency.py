"""``areal-launch check-consistency``: a run directory as an AReaL run leaves it (its resolved
config, its dumped steps in AReaL's layout), whose engine log-probs come from the real tiny model
sampling token by token, as our SGLang stand-in does. Scored against those weights it is
consistent; against another revision of them (another seed) it is flagged and exits 1. Bad input
is one line. The real AReaL runs check theirs in tests/test_areal.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "examples" / "areal" / "harness"))
from sampled_dump import write_run  # noqa: E402

pytestmark = pytest.mark.slow  # makes two models and runs transformers in subprocesses

MAKE_TINY = REPO / "examples" / "areal" / "harness" / "make_tiny.py"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "areal_watchdog.cli", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The tiny Qwen2 of the AReaL harness, made offline with two seeds (two revisions)."""
    made = {}
    for seed in (1, 2):
        root = tmp_path_factory.mktemp(f"tiny-{seed}")
        subprocess.run([sys.executable, str(MAKE_TINY), str(root), "--rows", "8", "--seed",
                        str(seed)], check=True, capture_output=True)  # fmt: skip
        made[seed] = root / "tiny-qwen2"
    return made


@pytest.fixture(scope="module")
def run_dir(models: dict[int, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(models[1], tmp_path_factory.mktemp("consistency"))


def test_an_engine_that_sampled_from_these_weights_is_consistent(run_dir: Path) -> None:
    done = cli("check-consistency", str(run_dir))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "rollout consistency, temperature 1, transformers on cpu (gaps in nats)"
    rows = {int(line.split()[0]): line.split() for line in lines if line[:1].isdigit()}
    assert sorted(rows) == [0, 1]
    assert rows[0][1] == "36" and rows[1][1] == "24"  # tokens: 3 and 2 groups of 2 x 6
    assert all(float(row[3]) < 1e-3 for row in rows.values()), done.stdout  # max |gap|
    assert "flag:" not in done.stdout
    plot = run_dir / "consistency" / "steps-0-1.svg"
    assert f"plot: {plot}" in done.stdout and "<svg" in plot.read_text()
    assert plot.read_text().count('id="bin-0-') == 8 and 'id="bin-1-7"' in plot.read_text()
    assert "step 0: 6 sequences scored" in done.stderr


def test_another_revision_of_the_weights_is_flagged(
    run_dir: Path, models: dict[int, Path], tmp_path: Path
) -> None:
    plot = tmp_path / "other.svg"
    done = cli("check-consistency", str(run_dir), "--steps", "1", "--weights", str(models[2]),
               "--plot", str(plot))  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "flag: a mean gap of " in done.stdout and "another revision" in done.stdout
    assert "  worst: group " in done.stdout
    assert plot.read_text().count('id="bin-1-') == 8  # one bar per bin, one step


def test_bad_input_is_one_line(run_dir: Path, tmp_path: Path) -> None:
    for args, said in (
        (["--steps", "7"], "--steps: no dump of step 7 in "),
        (["--steps", "x"], "--steps x: not a list of steps (e.g. 0,2-3)"),
        (["--weights", str(tmp_path)], f"{tmp_path}: cannot load the weights ("),
        (["--generate", "2"], "--generate N and --server HOST:PORT go together"),
        (
            ["--generate", "2", "--server", "http://127.0.0.1:9/v1"],
            "--server http://127.0.0.1:9/v1: give host:port or http://host:port",
        ),
    ):
        done = cli("check-consistency", str(run_dir), *args)
        (line,) = done.stderr.strip().splitlines()[-1:]
        assert done.returncode == 2 and said in line, done.stderr
        assert "Traceback" not in done.stderr
    empty = tmp_path / "e" / "t"
    (empty / "watchdog").mkdir(parents=True, mode=0o700)
    (empty / "watchdog" / "launch_config.yaml").write_text(
        (run_dir / "watchdog" / "launch_config.yaml").read_text()
    )
    done = cli("check-consistency", str(empty))
    assert done.returncode == 2
    assert done.stderr.strip().endswith("debug_trajectories: no complete trajectory dump to check")


def test_a_recover_checkpoint_is_read_as_the_replay_reads_it(
    run_dir: Path, models: dict[int, Path], tmp_path: Path
) -> None:
    """AReaL's recover checkpoint is a torch distributed checkpoint of ``DCPState``
    (``{"dcp": {"model": ..., "optim": ...}}``, ``fsdp_utils/checkpoint.py``) with no model
    config. One holding moved weights of the run's model, passed as the weights, is flagged:
    its tensors were read, not actor.path's."""
    import torch
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    moved = AutoModelForCausalLM.from_pretrained(models[1], dtype=torch.float32)
    with torch.no_grad():
        for tensor in moved.parameters():
            tensor.add_(0.3 * torch.randn_like(tensor, generator=torch.Generator().manual_seed(0)))
    checkpoint = tmp_path / "recover_checkpoint"
    state = {"model": moved.state_dict(), "optim": {"step": torch.tensor(3.0)}}  # optim: unread
    dcp.save({"dcp": state}, checkpoint_id=str(checkpoint))
    assert not (checkpoint / "config.json").exists()
    done = cli("check-consistency", str(run_dir), "--steps", "1", "--weights", str(checkpoint))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "flag: a mean gap of " in done.stdout and "another revision" in done.stdout
