"""Config loading, overrides and the CLI's errors and dry run, as a user meets them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from areal_watchdog.cli import main
from areal_watchdog.common.errors import ConfigError
from areal_watchdog.config.load import load_config
from conftest import REPO
from testkit.launcher import DEMO_CONFIG

GOOD = """\
experiment_name: exp
trial_name: t1
cluster: {n_nodes: 1, n_gpus_per_node: 2, fileroot: FILEROOT}
actor: {path: /models/qwen, lr: 1.0e-6}
ref:
  path: ${actor.path}
launch: {entrypoint: ENTRY, args: [--seed, 1]}
watchdog: {stall_timeout: 30, on_hang: report}
"""


SINK = "{type: webhook, url_env: HOOK_URL"
# Nine levels of nine aliases: 9**9 values once expanded, a few hundred bytes on disk.
BILLION_LAUGHS = b"a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + b"".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n".encode() for i in range(1, 9)
)  # the start of a sink entry, closed by each case


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    entry = tmp_path / "train.py"
    entry.write_text("print('hi')\n")
    path = tmp_path / "config.yaml"
    path.write_text(GOOD.replace("FILEROOT", str(tmp_path / "root")).replace("ENTRY", str(entry)))
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_interpolations_resolve_and_unknown_keys_pass_through(config_file: Path) -> None:
    config = load_config(config_file)
    assert config.raw["ref"]["path"] == "/models/qwen"
    assert config.launch.nproc_per_node == 2  # from cluster.n_gpus_per_node
    tree = config.job_tree()
    assert "launch" not in tree and "watchdog" not in tree
    assert tree["actor"] == {"path": "/models/qwen", "lr": 1.0e-6}


def test_hydra_overrides(config_file: Path) -> None:
    config = load_config(
        config_file, ["actor.path=/m2", "+rollout.n=4", "~ref", "watchdog.stall_timeout=auto"]
    )
    assert config.raw["actor"]["path"] == "/m2"
    assert config.raw["rollout"] == {"n": 4}
    assert "ref" not in config.raw
    assert config.watchdog.stall_timeout is None


def test_override_of_unknown_key_says_how_to_add_it(config_file: Path) -> None:
    with pytest.raises(ConfigError, match=r"actr\.path.*\+actr\.path=/x"):
        load_config(config_file, ["actr.path=/x"])


@pytest.mark.parametrize(
    ("override", "key", "words"),
    [
        ("~launch.entrypoint", "launch.entrypoint", "is missing"),
        ("watchdog.stall_timeout=-5", "watchdog.stall_timeout", "must be positive"),
        ("+watchdog.startup_timeout=-1", "watchdog.startup_timeout", "must be positive"),
        ("+launch.nproc_per_node=four", "launch.nproc_per_node", "whole number"),
        ("watchdog.on_hang=explode", "watchdog.on_hang", "report, cancel"),
        ("+watchdog.resume.allocation=old", "watchdog.resume.allocation", "new, same"),
        ("+watchdog.step_regex=step", "watchdog.step_regex", "group"),
        ("experiment_name=my_exp", "experiment_name", "may not contain '_'"),
        ("+watchdog.auto_factor=0.5", "watchdog.auto_factor", "must be at least 1, got 0.5"),
        ("+watchdog.stall_timout=8", "watchdog.stall_timout", "did you mean stall_timeout?"),
        ("+launch.nprocs=2", "launch.nprocs", "did you mean nproc_per_node?"),
        ("+watchdog.gpu.idle_timout=3", "watchdog.gpu.idle_timout", "did you mean idle_timeout?"),
        ("experiment_name=..", "experiment_name", "is not a name"),
        ("trial_name=..", "trial_name", "is not a name"),
        ("trial_name=.", "trial_name", "is not a name"),
        ("trial_name=''", "trial_name", "is not a name"),
        ("+watchdog.poll_interval=.nan", "watchdog.poll_interval", "finite number"),
        ("watchdog.stall_timeout=.inf", "watchdog.stall_timeout", "finite number"),
        ("+launch.nproc_per_node=100000", "launch.nproc_per_node", "at most 1024"),
        ("+launch.python=/no/such/python3", "launch.python", "not an executable Python"),
        ("launch=[1,2]", "launch", "must be a mapping"),
        ("+watchdog.startup_timeout=2026-11-22", "watchdog.startup_timeout", "must be a number"),
        ("trial_name=a/b", "trial_name", "is not a name"),
        ("+launch.slurm={partiton: gpu}", "launch.slurm.partiton", "did you mean partition?"),
        (f"+watchdog.notify=[{SINK}, timout: 3}}]", "notify[0].timout", "did you mean timeout?"),
        (f"+watchdog.notify=[{SINK}, url_evn: X}}]", "notify[0].url_evn", "did you mean url_env?"),
        (f"+watchdog.notify=[{SINK}, timeout: .nan}}]", "notify[0].timeout", "finite number"),
        (f"+watchdog.notify=[{SINK}, timeout: .inf}}]", "notify[0].timeout", "finite number"),
        (f"+watchdog.notify=[{SINK}, max_attempts: 0}}]", "notify[0].max_attempts", "at least 1"),
    ],
)
def test_bad_values_name_key_and_file(
    capsys: pytest.CaptureFixture[str], config_file: Path, override: str, key: str, words: str
) -> None:
    code, out, err = run_cli(capsys, "--watchdog", "local", str(config_file), override)
    assert code == 2
    assert key in err and words in err and str(config_file) in err
    assert "Traceback" not in err and out == ""
    assert len(err.strip().splitlines()) == 1
    assert not (config_file.parent / "root").exists(), "nothing may start or be written"


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00binary", "is not UTF-8 text"),
        ("latin: caf\xe9\n".encode("latin-1"), "is not UTF-8 text"),
        (b"null: 1\nlaunch: {entrypoint: x.py}\n", "holds a key that is null"),
        (b"a: " + b"[" * 2000 + b"]" * 2000 + b"\n", "nested too deeply"),
        (b"watchdog: {stall_timeout: 2026-11-22}\n", "`watchdog.stall_timeout`: is a date (2026"),
        (b"x: {y: [1, !!binary aGVsbG8=]}\n", "`x.y[1]`: is a bytes"),
        (BILLION_LAUGHS, "expands to over 100,000 values through its aliases"),
        (b"launch: {entrypoint: x.py}\nfoo: ${nope.missing}\n", "Interpolation key 'nope.missing'"),
        (b"watchdog: {debug_env: {null: 1}}\n", "`watchdog.debug_env`: holds a key that is null"),
    ],
)
def test_unreadable_configs_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, words: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(content)
    code, _, err = run_cli(capsys, "local", str(bad))
    assert code == 2 and words in err and str(bad) in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_fileroot_that_is_a_file_or_unwritable(
    capsys: pytest.CaptureFixture[str], config_file: Path, tmp_path: Path
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    code, _, err = run_cli(capsys, "local", str(config_file), f"cluster.fileroot={a_file}/x")
    assert code == 2 and "cluster.fileroot" in err and "is not a directory" in err


def test_entrypoint_beside_the_config_wins_over_the_working_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "train.py").write_text("print('the right one')\n")
    (elsewhere / "train.py").write_text("print('the wrong one')\n")
    config = project / "config.yaml"
    config.write_text(GOOD.replace("FILEROOT", str(tmp_path / "root")).replace("ENTRY", "train.py"))
    monkeypatch.chdir(elsewhere)
    code, out, _ = run_cli(capsys, "local", str(config), "--dry-run")
    assert code == 0
    assert str(project / "train.py") in out and str(elsewhere / "train.py") not in out


def test_yaml_syntax_error_names_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("launch:\n  entrypoint: x.py\n  args: [a, b\nwatchdog: {}\n")
    code, _, err = run_cli(capsys, "local", str(bad))
    assert code == 2 and "YAML syntax error at line" in err and str(bad) in err


def test_missing_file_and_unknown_backend(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "local", "/nonexistent.yaml")
    assert code == 2 and "/nonexistent.yaml: no such config file" in err
    with pytest.raises(SystemExit) as exc:
        main(["kubernetes", str(DEMO_CONFIG)])
    assert exc.value.code == 2
    assert "invalid choice: 'kubernetes'" in capsys.readouterr().err


def test_missing_entrypoint_file(capsys: pytest.CaptureFixture[str], config_file: Path) -> None:
    code, _, err = run_cli(capsys, "local", str(config_file), "launch.entrypoint=nope.py")
    assert code == 2 and "launch.entrypoint" in err and "no such file: nope.py" in err


def test_dry_run_prints_plan_and_starts_nothing(
    capsys: pytest.CaptureFixture[str], config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_supersecretvalue123")
    code, out, _ = run_cli(
        capsys,
        "--watchdog",
        "local",
        str(config_file),
        "--dry-run",
        "+launch.env.HF_TOKEN=hf_supersecretvalue123",
        "watchdog.stall_timeout=12",
    )
    assert code == 0
    assert "torch.distributed.run --standalone --nnodes 1 --nproc-per-node 2" in out
    assert "-m areal_watchdog.rank.main" in out and "--seed 1 --config" in out
    assert "areal_watchdog.watch.sidecar" in out
    assert "TORCH_DISTRIBUTED_DEBUG=INFO" in out and "PYTHONFAULTHANDLER=1" in out
    assert "launch.json" in out and "job_config.yaml" in out
    assert "hf_supersecretvalue123" not in out and "HF_TOKEN=[REDACTED]" in out
    assert not (config_file.parent / "root").exists()


def test_debug_env_can_be_overridden_and_switched_off(config_file: Path) -> None:
    config = load_config(
        config_file,
        ["+watchdog.debug_env.NCCL_DEBUG=INFO", "+watchdog.debug_env.TORCH_DISTRIBUTED_DEBUG=null"],
    )
    assert config.watchdog.debug_env["NCCL_DEBUG"] == "INFO"
    assert "TORCH_DISTRIBUTED_DEBUG" not in config.watchdog.debug_env


def test_without_watchdog_flag_the_job_runs_plain(
    capsys: pytest.CaptureFixture[str], config_file: Path
) -> None:
    config_file.write_text(
        config_file.read_text().replace("on_hang: report", "on_hang: report, enabled: false")
    )
    code, out, _ = run_cli(capsys, "local", str(config_file), "--dry-run")
    assert code == 0 and "areal_watchdog.watch.sidecar" not in out and "rank_main" not in out


@pytest.mark.parametrize("backend", ["local", "slurm"])
def test_dry_run_never_prints_a_secret_from_launch_env(
    capsys: pytest.CaptureFixture[str], config_file: Path, backend: str
) -> None:
    secret = "sk-live-0123456789abcdefghij"
    code, out, _ = run_cli(
        capsys, backend, str(config_file), f"+launch.env.EXTRA_API_KEY={secret}", "--dry-run"
    )
    assert code == 0 and secret not in out and "EXTRA_API_KEY=[REDACTED]" in out


@pytest.mark.parametrize(
    ("line", "kept"),
    [
        ("login ok password=hunter2-long user=bob", "password=[REDACTED] user=bob"),
        ('config: {"api_key": "abcd1234efgh"}', '"api_key": "[REDACTED]"'),
        ("cloning with ghp_abcdefghijklmnopqrstuvwx0123 now", "cloning with [REDACTED] now"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload", "Authorization: [REDACTED]"),
        ("pat github_pat_11ABCDEFG0123456789_abcdefghijk end", "pat [REDACTED] end"),
        ("bot xoxb-1234567890-abcdefghijkl end", "bot [REDACTED] end"),
        ("key sk-proj-abcdefghijklmnopqrstuvwx end", "key [REDACTED] end"),
        ("id AKIAIOSFODNN7EXAMPLE end", "id [REDACTED] end"),
        ("export MY_TOKEN=abcdef123456 done", "MY_TOKEN=[REDACTED] done"),
    ],
)
def test_secrets_in_free_text_are_scrubbed(line: str, kept: str) -> None:
    from areal_watchdog.common.secrets.redact import Redactor

    assert kept in Redactor().scrub(line)


def test_optional_values_default_to_none_not_an_empty_string(config_file: Path) -> None:
    config = load_config(config_file)
    assert config.watchdog.gpu.recording is None and config.launch.config_arg == "--config"
    assert load_config(config_file, ["+launch.config_arg=null"]).launch.config_arg is None


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="needs root and util-linux's setpriv to act as a second user",
)
def test_a_fileroot_another_user_cannot_write_is_one_line_for_that_user(tmp_path: Path) -> None:
    """As root every folder is writable, so the check runs as nobody on a folder root owns."""
    shared = Path(tempfile.mkdtemp(prefix="areal-fileroot-"))  # readable by nobody, unlike tmp_path
    try:
        shared.chmod(0o755)
        (shared / "train.py").write_text("print('hi')\n")
        (shared / "locked").mkdir(mode=0o755)
        config = shared / "config.yaml"
        runs = shared / "locked" / "runs"
        config.write_text(f"cluster: {{fileroot: {runs}}}\nlaunch: {{entrypoint: train.py}}\n")
        config.chmod(0o644)
        result = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             sys.executable, "-m", "areal_watchdog.cli", "local", str(config), "--dry-run"],
            capture_output=True, text=True, timeout=60, cwd="/",
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
    finally:
        shutil.rmtree(shared)
    assert result.returncode == 2, result.stderr
    assert f"`cluster.fileroot`: {shared / 'locked'} is not writable by this user" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"),
    reason="needs root and unshare for a private read-only mount",
)
def test_a_read_only_fileroot_is_one_line_even_for_root(config_file: Path, tmp_path: Path) -> None:
    """Root may write anywhere by permissions, not on a read-only mount (made in a private
    mount namespace that ends with the command)."""
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    script = (
        f"mount --bind {frozen} {frozen} && mount -o remount,bind,ro {frozen} && "
        f"exec {sys.executable} -m areal_watchdog.cli local {config_file} "
        f"cluster.fileroot={frozen}/runs --dry-run"
    )
    result = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    if "mount:" in result.stderr:
        pytest.skip(f"no private mounts here: {result.stderr.strip()}")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"`cluster.fileroot`: {frozen} is not writable by this user" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_secret_of_launch_env_never_reaches_the_run_directory(config_file: Path) -> None:
    """launch_config.yaml keeps the whole config for replay, but not the value of a
    secret-looking launch.env variable (nor one that looks like a token)."""
    from areal_watchdog.launch.local import LocalBackend

    overrides = [
        "+launch.env.WANDB_API_KEY=wandb-secret-4242",
        "+launch.env.HELPER_URL=https://bot:hunter2pass@example.org/x",
        "+launch.env.PLAIN=visible",
    ]
    plan = LocalBackend().plan(load_config(config_file, overrides), watchdog=True)
    stored = next(text for path, text in plan.files.items() if path.endswith("launch_config.yaml"))
    assert "wandb-secret-4242" not in stored and "hunter2pass" not in stored
    assert "WANDB_API_KEY: '[REDACTED]'" in stored and "PLAIN: visible" in stored
    assert plan.main().env["WANDB_API_KEY"] == "wandb-secret-4242"  # the job still gets it
