"""The real AReaL package launched by ``areal-launch``, on a CPU, in both of its modes, against
both releases users run (``areal``: 1.0.4 from PyPI in ``.venv``; 2.0.0, built from its
``v2.0.0`` tag, in ``.venv-areal2``: ``scripts/setup.sh --areal``), the longest runs taking turns
between them (docs/areal.md).

What runs for real: AReaL's GRPO trainer (``PPOTrainer``) with its local scheduler, ``rpc_server``
workers, FSDP engine on gloo, ``RemoteSGLangEngine`` client, workflow executor, staleness
manager, disk weight updates, GSM8K reward, and in SPMD mode its own inference-server launcher
(``areal.infra.launcher.sglang_server``) and name_resolve. What stands in: the model (a tiny
Qwen2 made offline) and SGLang (``examples/inference_server``, which AReaL launches itself through
the ``sglang`` names it imports). Every run sits in a loopback-only network namespace
(``scripts/loopback.sh``): AReaL binds ``0.0.0.0`` and advertises ``gethostip()``, which there is
127.0.0.1, so nothing listens beyond loopback.

The hangs come in through AReaL's own extension points: a dataset row whose calculator tool never
returns (``examples/areal/tool_workflow.py``), and an inference server that wedges.
"""

from __future__ import annotations

import copy
import getpass
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from recording import record_evidence
from test_launcher_lifecycle import gone_within, wait_for

from areal_watchdog.cli import main
from areal_watchdog.common.roles import Identity, identify
from areal_watchdog.config.areal_side.areal import parse_allocation
from areal_watchdog.config.load import load_config
from areal_watchdog.launch.local import LocalBackend
from conftest import REPO, culprit_rows, timeline_of
from slurm_cluster import wait_until
from testkit.launcher import Launcher, LaunchResult, processes_under
from testkit.reports import read_reports, suspected_looks

AREAL = REPO / "examples" / "areal"
CONFIG = AREAL / "gsm8k_grpo.yaml"
LOOPBACK_SCRIPT = REPO / "scripts" / "loopback.sh"
LOOPBACK = ["bash", str(LOOPBACK_SCRIPT)]
CLUSTER = REPO / "scripts" / "slurm-cluster.sh"
# One role's scheduling spec (AReaL's SchedulingSpec), to be closed with its node.
SPEC = (
    "{task_type: worker, port_count: 2, gpu: 0, cpu: 1, mem: 2, "
    "cmd: 'python3 -m areal.infra.rpc.rpc_server'"
)
FAST = ["watchdog.stall_timeout=12", "watchdog.poll_interval=0.5"]
CANCEL_AFTER = "+watchdog.cancel_after=24"  # the hard limit: a tool that never returns
SHIPPED = ["watchdog.stall_timeout=auto", "watchdog.poll_interval=1"]  # FAST's, back to defaults

needs_areal = pytest.mark.skipif(
    importlib.util.find_spec("areal") is None, reason="the areal package is not installed "
    "(bash scripts/setup.sh --areal)",
)  # fmt: skip
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a loopback-only network namespace needs root and unshare",
)


def make_harness(root: Path, *marks: str) -> Path:
    """The tiny model, tokenizer and GSM8K rows, some marked (``harness/make_tiny.py``),
    made offline."""
    make = [sys.executable, str(AREAL / "harness" / "make_tiny.py"), str(root), *marks]
    subprocess.run(make, check=True, capture_output=True)
    return root


@pytest.fixture(scope="session")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rows 8-11 poisoned (the rollout's tool never returns on them), made once."""
    return make_harness(tmp_path_factory.mktemp("areal-harness"), "--poison-from", "8")


@pytest.fixture(scope="session")
def train_harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Row 4 (step 2) holds the document separator that the tiny model's own code loops on in
    the trainer (``harness/modeling_tiny.py``); no rollout-side poison."""
    return make_harness(tmp_path_factory.mktemp("areal-train-harness"), "--train-poison-from", "4")


def run_areal(
    launcher: Launcher, harness: Path, trial: str, overrides: list[str], python: str,
    **kwargs: object,
) -> LaunchResult:  # fmt: skip
    """``areal-launch --watchdog local examples/areal/gsm8k_grpo.yaml`` in a loopback netns,
    the job run by ``python`` (the AReaL release under test)."""
    link = launcher.root / "harness"
    if link.is_symlink():
        link.unlink()
    link.symlink_to(harness)
    kwargs.setdefault("prefix", LOOPBACK)
    kwargs.setdefault("timeout", 420)
    overrides = [*FAST, f"++launch.python={python}", *overrides]
    return launcher.run(overrides, trial=trial, config=CONFIG, **kwargs)


@pytest.fixture(scope="module")
def loopback_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[str], dict]]:
    """A two-node Slurm cluster in a loopback-only network namespace of its own: (the command
    prefix that enters it, the environment that finds the cluster and the singularity
    stand-in). Torn down, namespace included, whatever the tests did."""
    if subprocess.run(["bash", str(CLUSTER), "install"], capture_output=True).returncode:
        pytest.skip("needs Debian's slurm-wlm and munge (bash scripts/slurm-cluster.sh install)")
    name = f"areal-lo-{os.getpid()}"
    state = tmp_path_factory.mktemp("slurm-lo")
    enter = ["nsenter", f"--net=/var/run/netns/{name}"]
    env = {
        **os.environ,
        "AREAL_SLURM_DIR": str(state),
        "SLURM_CONF": str(state / "slurm.conf"),
        "AREAL_SLURM_FIRST_JOB_ID": "500000",
    }  # never the default cluster's (test_slurm.py)
    env["PATH"] = f"{AREAL / 'harness' / 'bin'}:{env['PATH']}"
    subprocess.run(["bash", str(LOOPBACK_SCRIPT), "--create", name], check=True)
    try:
        up = subprocess.run([*enter, "bash", str(CLUSTER), "up"], env=env, capture_output=True,
                            text=True, timeout=180)  # fmt: skip
        assert up.returncode == 0, up.stderr[-2000:]
        yield enter, env
    finally:
        subprocess.run([*enter, "bash", str(CLUSTER), "down"], env=env, capture_output=True)
        subprocess.run(["bash", str(LOOPBACK_SCRIPT), "--delete", name], capture_output=True)


class RoleWatch:
    """The roles of every process of the AReaL jobs under ``root`` seen while the block runs
    (sampled): tests running side by side see only their own."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.roles: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> RoleWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            for proc in psutil.process_iter():
                try:
                    env = proc.environ()
                    if not env.get("AREAL_WATCHDOG_DIR", "").startswith(self.root):
                        continue
                    who = identify(proc.cmdline(), env, env.get("AREAL_WATCHDOG_JOB_CONFIG", ""))
                except (psutil.Error, OSError):
                    continue
                if who is not None:
                    self.roles.add(who.role)


ROLLOUT_SIDE = {"rollout", "eval-rollout", "inference_server", "inference_launcher"}


def step_stats(log: Path, step: int) -> dict[str, str]:
    """The statistics table AReaL's StatsLogger prints after ``Train step {step}/N done``."""
    text = log.read_text(errors="replace")
    block = text.split(f"Train step {step}/", 1)[1].split("Train step", 1)[0]
    stats = {}
    for line in block.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        stats.update(zip(cells[::2], cells[1::2], strict=False))
    return stats


def replay_watched(
    run_dir: Path, *steps: str, code: int = 0
) -> tuple[subprocess.CompletedProcess, RoleWatch]:
    """``areal-launch replay RUN_DIR STEPS...`` in a loopback netns, ended with ``code``, and
    the roles of every process of an AReaL job seen meanwhile."""
    with RoleWatch(run_dir.parent) as seen:
        replayed = subprocess.run(
            [*LOOPBACK, sys.executable, "-m", "areal_watchdog.cli", "replay", str(run_dir),
             *steps],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert replayed.returncode == code, (replayed.stdout + replayed.stderr)[-4000:]
    return replayed, seen


def by_role(report: dict) -> dict[str, list[dict]]:
    roles: dict[str, list[dict]] = {}
    for process in report["ranks"] + report["workers"]:
        roles.setdefault(process.get("role", "rank"), []).append(process)
    return roles


@needs_areal
@needs_root
@pytest.mark.slow
def test_single_controller_hang_names_the_rollout_worker(
    launcher: Launcher, harness: Path, areal: str
) -> None:
    """AReaL 1.0's recommended mode: one controller, workers started by AReaL's scheduler. At
    step 5 the poisoned rows' tool never returns; the controller waits in prepare_batch. A tool
    that never returns has a slow tool's stack: suspected (written, not posted) until the hard
    limit (``cancel_after``) ends the job."""
    result = run_areal(launcher, harness, "sc", python=areal, overrides=[CANCEL_AFTER])
    assert result.returncode == 3, result.output[-4000:]
    # the first poll may come after AReaL's first steps: any of them before the hang
    assert re.search(r"first step seen: step [1-4]\b", result.output), result.output[-4000:]
    (report,) = result.reports
    assert report["schema_version"] == 4
    category = (report["category"], report["cause"])
    assert category == ("rollout_stalled", "workflow_stuck"), report["summary"]
    assert report["last_step"] == 4
    assert report["confirmation"]["by"] == "hard_limit" and report["stalled_for_s"] >= 24
    # the hang's look was suspected, not posted (unless its first look, slow under CI's load,
    # met the hard limit first: then the hard limit decided, and no look was written); a slow
    # step before it may have been suspected too (and not posted either: its stacks moved)
    looks = suspected_looks(result.run_dir)
    assert all(look["confirmation"]["posted"] is False for look in looks), looks
    (culprit,) = report["culprit_workers"]
    assert (culprit["role"], culprit["index"]) == ("rollout", 0)
    roles = by_role(report)
    assert culprit["pid"] == roles["rollout"][0]["pid"] and culprit["node"]
    picture = timeline_of(report)
    assert [row for row in culprit_rows(picture) if "rollout" in row], picture["rows"]
    # the hard limit decided (a suspected look that began before it may end after it)
    assert {look["kind"] for look in picture["looks"]} <= {"suspected", "hard limit"}
    assert [look["t"] for look in picture["looks"] if look["kind"] == "hard limit"] == [24.0]
    assert "The controller" in report["summary"] and "run_tool() at" in report["summary"]
    assert {"controller", "actor", "rollout", "eval-rollout", "inference_server"} <= set(roles)
    (actor,) = roles["actor"]
    assert (actor["rank"], actor["index"]) == (0, 0)
    (controller,) = roles["controller"]
    assert "prepare_batch" in controller["where"]
    assert all(s["address"].startswith("127.0.0.1:") for s in report["servers"])
    assert "culprit workers rollout 0 (pid" in result.output
    record_evidence(report, "workflow_stuck--areal-single-controller", "rollout")
    # Every step's batch was dumped from the controller, with no edit of the script.
    dumps = sorted(p.name for p in (result.run_dir / "debug_trajectories").glob("*.pt"))
    assert dumps == [f"step_{s:06d}.pt" for s in range(4)]
    assert report["trajectory"]["replay_command"].endswith(f"{result.run_dir} --step 3")
    markdown = next(result.run_dir.glob("incidents/*/report.md")).read_text()
    assert "A replay has no rollout" in markdown  # a rollout stall is not what replay shows
    # Steps 0-1 replay from the initial weights: the first has the same statistics, and not
    # one rollout worker or inference server started.
    replayed, seen = replay_watched(result.run_dir, "--from", "0", "--to", "1")
    assert {"controller", "actor"} <= seen.roles and not seen.roles & ROLLOUT_SIDE
    runs = launcher.root / "gsm8k-grpo"
    logs = [
        next((runs / t / "watchdog" / "logs").glob("controller_*.log"))
        for t in ("sc", "sc_replay0to1")
    ]
    replayed_log = logs[1].read_text(errors="replace")
    assert "Train step 2/" in replayed_log and "Train step 3/" not in replayed_log
    original, again = (step_stats(log, 1) for log in logs)
    assert again["ppo_actor/update/entropy/avg"] == original["ppo_actor/update/entropy/avg"]
    assert {k: v for k, v in again.items() if k.startswith("ppo_actor/update/")} == {
        k: v for k, v in original.items() if k.startswith("ppo_actor/update/")
    }


TWO_RANKS = ["actor.backend=fsdp:d2", "+actor.ppo_n_minibatches=2"]
RECOVER = ["recover.mode=auto", "+recover.freq_steps=1"]
RESUME = ["watchdog.on_hang=resume", "+watchdog.resume.backoff=1"]


@needs_areal
@needs_root
@pytest.mark.slow
@pytest.mark.parametrize("areal", ["2.0.0"], indirect=True)  # 1.0.4: the SPMD resume test below
def test_a_data_dependent_hang_is_replayed_bisected_to_its_row_and_the_job_resumes_without_it(
    launcher: Launcher, train_harness: Path, areal: str
) -> None:
    """A data-dependent hang in the trainer, on the single controller with ``on_hang: resume``:
    at global step 2 one DP rank spins in the model's own code over a sample, its peer waits in
    FSDP's all-gather. After the report the launcher replays the step on this node from AReaL's
    recover checkpoint of step 1, with no rollout; it hangs the same way (the hang follows the
    data), so the batch is bisected to the one poisoned row, which is quarantined, and the job
    resumes from the checkpoint without it and completes by itself. No replay writes a recover
    checkpoint; a healthy dumped step then replays re-sharded onto one rank."""
    result = run_areal(
        launcher, train_harness, "tr", python=areal,
        overrides=[*TWO_RANKS, *RECOVER, *RESUME, "total_train_steps=3",
                   "+watchdog.resume.max_replays=2"], timeout=900,  # the other half inferred
    )  # fmt: skip
    assert result.returncode == 0, result.output[-4000:]
    (report,) = result.reports  # the replays report in their own run directories
    assert (report["category"], report["last_step"]) == ("straggler", 2)
    (culprit,) = report["culprit_ranks"]
    same_place = ("restart_positions() <- TinyQwen2ForCausalLM.forward()", "all_gather_single")
    assert f"while rank {1 - culprit} waits in all_gather_single" in report["summary"]
    assert all(place in report["summary"] for place in same_place), report["summary"]
    assert report["collectives"]["agreement"].startswith("the stacks and the collective record")
    assert report["trajectory"]["replay_command"].endswith(f"{result.run_dir} --step 2")
    record_evidence(report, f"straggler_w2_r{culprit}--areal2-fsdp2-all-gather")
    recovery = report["recovery"]
    assert (recovery["decision"], recovery["resumes_after_step"]) == ("resume", 1)
    whole, *bisection = recovery["replays"]
    assert whole["groups"] is None and whole["hung"], recovery
    assert "restart_positions()" in whole["hang"] and "straggler" in whole["hang"]
    assert_replayed_the_same_way(Path(whole["run_dir"]), culprit, same_place)
    assert len(bisection) == 1 and len(bisection[0]["groups"]) == 1, recovery
    (row,) = recovery["rows_skipped"]
    assert "<|doc_sep|>" in row["prompt"] and recovery["narrowed"]["to"] == [row["group"]]
    rows = json.loads((result.run_dir / "quarantine.json").read_text())["rows"]
    assert [r["prompt"] for r in rows] == [row["prompt"]]
    follows = "hangs the same way when replayed on one node: the hang follows the data"
    assert follows in recovery["reason"]
    markdown = next(result.run_dir.glob("incidents/*/report.md")).read_text()
    assert "## Recovery" in markdown and "Rows left out of the resumed run" in markdown
    assert "quarantine: 1 row(s) of the training data left out" in result.output
    assert "after 1 resume(s) the job completed" in result.output
    # AReaL's line says "Train step 3/31": total_train_steps=3 caps it, and the teardown of
    # its controller after step 3 (over 12 s under load) is no hang
    assert "last step seen: step 3 of 3; the job's teardown counts as a hang after 300 s" in (
        result.output
    )
    shown = subprocess.run(
        [sys.executable, "-m", "areal_watchdog.cli", "status", str(result.run_dir)],
        capture_output=True, text=True, cwd=REPO, check=True,
    ).stdout  # fmt: skip
    assert "step 2: resume, time lost" in shown and "1 row(s) quarantined" in shown
    log = (result.run_dir / "watchdog" / "logs").glob("controller_*.log")
    assert "Recovering from StepInfo(" in next(log).read_text(errors="replace")
    saved = launcher.root / "checkpoints" / getpass.getuser() / "gsm8k-grpo"
    assert [p.parts[-3] for p in saved.glob("*/recover_info/step_info.json")] == ["tr"]
    # AReaL's recover checkpoint (FSDP2 shards of 2 ranks, step 2's weights) scores step 2's
    # tokens: one optimizer step at lr 1e-5 from the weights that generated them
    recover = saved / "tr" / "default" / "recover_checkpoint"
    scored = subprocess.run(
        [sys.executable, "-m", "areal_watchdog.cli", "check-consistency", str(result.run_dir),
         "--steps", "2", "--weights", str(recover)], capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert scored.returncode == 0, scored.stdout + scored.stderr
    step = next(line.split() for line in scored.stdout.splitlines() if line.startswith("2 "))
    assert int(step[1]) > 0 and float(step[2]) < 0.01, scored.stdout  # tokens, mean |gap|
    # A healthy step re-sharded onto one rank: the controller splits the dumped batch anew.
    replayed, _ = replay_watched(result.run_dir, "--step", "1", "--nproc", "1")
    assert "(actor fsdp:d1, rollout bypassed)" in replayed.stdout
    assert "not 0 (AReaL keeps the newest)" in replayed.stdout
    log = next((result.run_dir.parent / "tr_replay1" / "watchdog" / "logs").glob("controller_*"))
    assert "Train step 1/" in log.read_text(errors="replace")


def assert_replayed_the_same_way(replay_dir: Path, culprit: int, same_place: tuple) -> None:
    """The whole step's replay loaded the recover checkpoint of the step before, ran the
    controller and the actor but nothing of the rollout side, and its own report names the
    same rank at the same place."""
    said = (replay_dir / "areal-launch.log").read_text(errors="replace")
    assert "replay weights: AReaL's recover checkpoint of step 1 (" in said, said[:2000]
    logs = replay_dir / "watchdog" / "logs"
    controller = next(logs.glob("controller_*.log")).read_text(errors="replace")
    assert "Recovering from StepInfo(" in controller
    (again,) = read_reports(replay_dir)
    assert (again["category"], again["culprit_ranks"]) == ("straggler", [culprit])
    assert all(place in again["summary"] for place in same_place), again["summary"]
    roles = set(by_role(again))
    assert {"controller", "actor"} <= roles and not roles & ROLLOUT_SIDE, roles


def freeze_once(run_dir: Path, rank: int, after: str, done: threading.Event) -> None:
    """SIGSTOP ``rank`` of an SPMD run once, when the dump file ``after`` exists (a transient
    hang: the resumed job has no reason to hang again); never once ``done`` is set."""

    def freeze() -> None:
        registrations = run_dir / "watchdog" / "ranks" / "by_node"
        while not done.wait(0.2):
            found = list(registrations.glob(f"*/rank_{rank}.json"))
            if (run_dir / "debug_trajectories" / after).exists() and found:
                os.kill(json.loads(found[0].read_text())["pid"], signal.SIGSTOP)
                return

    threading.Thread(target=freeze, daemon=True).start()


@needs_areal
@needs_root
@pytest.mark.slow
@pytest.mark.parametrize("areal", ["1.0.4"], indirect=True)  # 2.0.0: the resume test above
def test_spmd_rank_frozen_once_replays_clean_and_the_job_resumes(
    launcher: Launcher, harness: Path, areal: str
) -> None:
    """``on_hang: resume`` in SPMD on two ranks: rank 1 freezes once, after dumping step 1. The
    report names it; the dumped step replays on torchrun alone (no server launcher) without
    hanging, so the hang is transient; the job resumes from AReaL's recover checkpoint (the
    server launcher, name_resolve and torchrun again) and completes."""
    run_dir, done = launcher.root / "gsm8k-grpo" / "frozen", threading.Event()
    freeze_once(run_dir, rank=1, after="step_000001_dp_1.pt", done=done)
    try:
        result = run_areal(
            launcher, harness, "frozen", python=areal, timeout=900,
            overrides=["launch.mode=spmd", *TWO_RANKS, *RECOVER, *RESUME, "total_train_steps=3"],
        )  # fmt: skip
    finally:
        done.set()  # a pid of this run is never signalled after it
    assert result.returncode == 0, result.output[-4000:]
    (report,) = result.reports
    assert report["culprit_ranks"] == [1] and "stopped" in report["summary"], report["summary"]
    record_evidence(report, f"{report['category']}_w2_r1--areal-spmd-frozen-rank")
    recovery = report["recovery"]
    (replayed,) = recovery["replays"]
    assert (replayed["groups"], replayed["hung"], replayed["exit_code"]) == (None, False, 0)
    assert "without hanging" in recovery["reason"] and recovery["rows_skipped"] == []
    log = (Path(replayed["run_dir"]) / "areal-launch.log").read_text()
    assert "inference-servers" not in log  # the replay is torchrun alone
    assert "after 1 resume(s) the job completed" in result.output
    trained = launcher.root / "logs" / getpass.getuser() / "gsm8k-grpo" / "frozen" / "trainer.log"
    assert "Recovering from StepInfo(" in trained.read_text(errors="replace")


@needs_areal
@needs_root
@pytest.mark.slow
def test_spmd_wedged_server_is_named_and_a_dumped_step_replays_without_servers(
    launcher: Launcher, harness: Path, areal: str
) -> None:
    """AReaL's SPMD mode: its own server launcher first, name_resolve, then torchrun. The
    inference server stops answering after its 6th request: rank 0 waits for rollouts. The step
    rank 0 dumped before (no edit of the script) replays with torchrun alone: no server
    launcher, no inference server, no wait for name_resolve."""
    result = run_areal(
        launcher,
        harness,
        "spmd",
        python=areal,
        overrides=["launch.mode=spmd", "+launch.env.AREAL_STANDIN_WEDGE_AFTER=6"],
    )
    assert result.returncode == 3, result.output[-4000:]
    assert "AREAL_LLM_SERVER_ADDRS=127.0.0.1:" in result.output
    (report,) = result.reports
    assert (report["category"], report["cause"]) == ("rollout_stalled", "inference_wedged")
    (culprit,) = report["culprit_workers"]
    roles = by_role(report)
    (server,) = roles["inference_server"]
    assert culprit["role"] == "inference_server" and culprit["pid"] == server["pid"]
    assert culprit["address"] == server["address"] and server["address"].startswith("127.0.0.1:")
    assert report["ranks"][0]["rank"] == 0 and "inference_launcher" in roles
    assert report["summary"].startswith("Rank 0 is waiting for rollouts in prepare_batch()")
    record_evidence(report, "inference_wedged--areal-spmd", "rollout")
    server_row = f"inference_server {server['address']}"
    assert culprit_rows(timeline_of(report)) == [server_row]
    dumps = sorted(p.name for p in (result.run_dir / "debug_trajectories").glob("*.pt"))
    assert dumps == ["step_000000_dp_0.pt"]
    replayed, seen = replay_watched(result.run_dir, "--step", "0")
    assert "inference-servers" not in replayed.stdout
    assert "rank" in seen.roles and not seen.roles & ROLLOUT_SIDE, seen.roles
    logs = launcher.root / "logs" / getpass.getuser() / "gsm8k-grpo" / "spmd_replay0"
    trained = (logs / "trainer.log").read_text(errors="replace")
    assert trained.count("Train step ") == 1 and "Training completes!" in trained
    # The same dumped step, checked for rollout consistency: the stand-in samples from the same
    # tiny model (float32) as transformers scores it with (actor.path: version 0's weights).
    checked = subprocess.run(
        [sys.executable, "-m", "areal_watchdog.cli", "check-consistency", str(result.run_dir)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (row,) = [line.split() for line in checked.stdout.splitlines() if line.startswith("0 ")]
    assert int(row[1]) > 0 and float(row[2]) < 0.05, checked.stdout  # tokens, mean |gap|
    assert (result.run_dir / "consistency" / "steps-0.svg").is_file()


@needs_areal
@needs_root
@pytest.mark.slow
@pytest.mark.parametrize("areal", ["1.0.4"], indirect=True)  # 2.0.0: its recorded evidence
def test_a_weight_update_one_server_never_answers_names_that_server_and_its_rollout_worker(
    launcher: Launcher, harness: Path, areal: str
) -> None:
    """Two inference servers; one of them (whichever claims the fault first) applies two weight
    updates from disk and never answers the third. The controller waits in update_weights, that
    server's rollout worker in _update_weights_from_disk: the report names both, not a rank in
    a "point-to-point send" (the actor's HTTP thread sits in requests' HTTPAdapter.send). At
    the shipped defaults the look opens when the held call is 5 s old, not at the warm-up's
    60 s floor."""
    claim = launcher.root / "held-update"
    faults = ["+launch.env.AREAL_STANDIN_HOLD_UPDATE_AFTER=2",
              f"+launch.env.AREAL_STANDIN_HOLD_UPDATE_CLAIM={claim}"]  # fmt: skip
    result = run_areal(
        launcher, harness, "lostupdate", python=areal,
        overrides=["rollout.backend=sglang:d2", *faults, *SHIPPED],
    )  # fmt: skip
    assert result.returncode == 3, result.output[-4000:]
    (report,) = result.reports
    assert report["category"] == "weight_sync_stuck", report["summary"]
    # the rollout side's sensor, before the warm-up's 60 s floor: the held server's socket
    assert report["trigger"] == "server_call_awaited", (report["trigger"], result.output[-3000:])
    held = claim.read_text()  # the stand-in that never answers says which it is
    evidence = json.loads(Path(report["files"]["evidence"]).read_text())
    (stuck,) = [  # the rollout worker whose own stacks are still in the update
        w["worker_index"] for w in evidence["workers"] if w.get("role") == "rollout"
        and "_update_weights_from_disk" in json.dumps(w["threads"])
    ]  # fmt: skip
    named = {(w["role"], w.get("address") or w.get("index")) for w in report["culprit_workers"]}
    assert named == {("inference_server", held), ("rollout", stuck)}, named
    assert held in report["summary"] and f"rollout {stuck} (pid" in report["summary"]
    assert "TrainController.update_weights()" in report["summary"]
    assert "point-to-point" not in report["summary"]
    record_evidence(report, "weight_sync_stuck_w1_r--areal-lost-disk-update")


@needs_areal
@needs_root
@pytest.mark.slurm
@pytest.mark.parametrize("areal", ["2.0.0"], indirect=True)  # 1.0.4: the same SlurmScheduler file
def test_single_controller_on_slurm_one_report_across_nodes_resumed_elsewhere_until_it_recurs(
    launcher: Launcher, tmp_path: Path, areal: str, loopback_slurm: tuple[list[str], dict]
) -> None:
    """The controller here, AReaL's Slurm scheduler submits the actor job to node1 and the
    rollout job to another node (through the singularity stand-in); every task starts a standby
    sidecar. One report names the controller here, the actor on node1 and the stuck rollout
    worker on node2. With ``on_hang: resume``: the dumped step replays on a node other than node2
    without hanging (the hang is on the rollout side), so AReaL's jobs are submitted again
    without node2; the rollout worker, now on node3, sticks at the same step on a poisoned row,
    and the launcher stops there. AReaL's jobs are cancelled with the run. Rows 8-15 poisoned,
    not 8-11: the rollout may draw rows two steps past the checkpoint it resumes from
    (``max_head_offpolicyness: 1``), and AReaL's checkpoint keeps the dataloader where the
    rollout left it, so the resumed run's step 5 starts at row 8, 10 or 12 (CI once resumed
    past rows 8-11 and completed)."""
    enter, env = loopback_slurm
    harness = make_harness(tmp_path / "h", "--poison-from", "8", "--poison-count", "8")
    result = run_areal(
        launcher, harness, "onslurm", python=areal, timeout=720,
        overrides=[f"actor.scheduling_spec=[{SPEC}, nodelist: node1}}]",
                   f"rollout.scheduling_spec=[{SPEC}, exclude: node1}}]", *RECOVER, *RESUME,
                   CANCEL_AFTER],
        backend="slurm", prefix=enter, env=env,
    )  # fmt: skip
    assert result.returncode == 3, result.output[-4000:]
    first, again = result.reports  # one report per hang, none for the nodes it then cancels
    for report in (first, again):
        assert (report["category"], report["cause"]) == ("rollout_stalled", "workflow_stuck")
        assert report["job"]["backend"] == "slurm"
        roles = by_role(report)
        assert roles["controller"][0]["node"] == socket.gethostname()
        assert roles["actor"][0]["node"] == "node1"
        assert [w for w in report["workers"] if "areal_watchdog/" in w["where"]] == []  # ours
    (culprit,) = first["culprit_workers"]
    assert (culprit["role"], culprit["node"]) == ("rollout", "node2")
    assert first["culprit_nodes"] == ["node2"] and {"node1", "node2"} <= set(first["job"]["nodes"])
    recovery = first["recovery"]
    assert recovery["decision"] == "resume" and recovery["nodes_excluded"] == ["node2"]
    (replayed,) = recovery["replays"]
    assert (replayed["hung"], replayed["exit_code"]) == (False, 0), recovery
    watched = [p.stem for p in (Path(replayed["run_dir"]) / "watchdog" / "status").glob("*.json")]
    assert len(watched) == 1 and watched != ["node2"], watched  # the replay's own node
    (culprit,) = again["culprit_workers"]
    assert (culprit["role"], culprit["node"]) == ("rollout", "node3")
    assert again["recovery"]["decision"] == "stop"
    assert "the same hang came back after a resume" in again["recovery"]["reason"]
    jobs = subprocess.run([*enter, "squeue", "-h"], env=env, capture_output=True, text=True)
    assert jobs.stdout.strip() == ""


@pytest.mark.slurm
def test_areal_jobs_are_cancelled_by_name(loopback_slurm: tuple[list[str], dict]) -> None:
    """AReaL cancels its jobs only from trainer.close(): the launcher cancels every job named
    ``<experiment>_<trial>:<role>``, and only those."""
    enter, env = loopback_slurm
    for name in ("exp_t1:actor", "exp_t1:rollout", "exp_t10:actor"):
        sbatch = [*enter, "sbatch", "-J", name, "-o", "/dev/null", "--wrap", "sleep 300"]
        subprocess.run(sbatch, env=env, check=True, capture_output=True)
    cancel = (
        "from areal_watchdog.launch.slurm.control.jobs import cancel_jobs; "
        "print(len(cancel_jobs('exp_t1:')))"
    )
    out = subprocess.run([*enter, sys.executable, "-c", cancel], env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == "2"
    # A cancelled job is listed as completing (CG) until its step is killed: not yet gone
    queued = [*enter, "squeue", "-h", "-t", "PENDING,RUNNING", "-o", "%j"]

    def left() -> list[str]:
        return subprocess.run(queued, env=env, capture_output=True, text=True).stdout.split()

    assert wait_until(lambda: left() == ["exp_t10:actor"], 20), left()
    subprocess.run([*enter, "scancel", "-n", "exp_t10:actor"], env=env, capture_output=True)


@needs_areal
@needs_root
@pytest.mark.slow
def test_nothing_of_an_areal_run_outlives_a_killed_launcher(
    launcher: Launcher, harness: Path, areal: str
) -> None:
    """``kill -9 areal-launch``: AReaL's workers are the controller's children, not ours, and
    outlive it; the sidecar, whose launcher is gone, ends every process of the run."""
    (launcher.root / "harness").symlink_to(harness)
    overrides = [*FAST, f"++launch.python={areal}"]
    proc, _ = launcher.start(overrides, trial="orphan", config=CONFIG, prefix=LOOPBACK)
    wait_for(proc, "first step seen", timeout=300)
    assert len(processes_under(launcher.root)) >= 5  # controller, workers, server, sidecar
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert gone_within(launcher.root, 30) == []


def test_roles_come_from_the_command_line() -> None:
    """AReaL's worker gets its RANK over HTTP later: its command line is what names it."""
    config = "/run/watchdog/job_config.yaml"
    rpc = ["python3", "-m", "areal.infra.rpc.rpc_server", "--port", "1", "--role", "rollout",
           "--worker-index", "2"]  # fmt: skip
    assert identify(rpc, {}, config) == Identity("rollout", 2)
    slurm = ["python", "-m", "areal.infra.rpc.rpc_server", "--role", "actor"]
    assert identify(slurm, {"SLURM_PROCID": "3"}, config) == Identity("actor", 3)
    server = ["python3", "-m", "areal.experimental.inference_service.sglang.launch_server",
              "--host", "127.0.0.1", "--port", "30000"]  # fmt: skip
    assert identify(server, {}, config) == Identity("inference_server", address="127.0.0.1:30000")
    assert identify(["python", "train.py", "--config", config], {}, config) == Identity(
        "controller"
    )
    wrapped = ["python", "-m", "areal_watchdog.rank.main", "train.py", "--config", config]
    assert identify(wrapped, {"RANK": "1"}, config) == Identity("rank", 1)
    assert identify(["python", "-m", "torch.distributed.run", "x.py"], {}, config) == Identity(
        "torchrun"
    )
    v2_server = ["python3", "-m", "areal.v2.inference_service.sglang.launch_server", "--host",
                 "127.0.0.1", "--port", "30001"]  # fmt: skip
    assert identify(v2_server, {}, config) == Identity(
        "inference_server", address="127.0.0.1:30001"
    )
    guard = ["python3", "-m", "areal.infra.rpc.guard", "--role", "rollout", "--worker-index", "1"]
    assert identify(guard, {}, config) == Identity("guard", 1)
    gateway = ["python", "-m", "areal.v2.inference_service.gateway", "--port", "9"]
    assert identify(gateway, {}, config) == Identity("gateway")
    vllm = ["/v/bin/vllm", "serve", "m", "--host", "127.0.0.1", "--port", "8000"]
    assert identify(vllm, {}, config) == Identity("inference_server", address="127.0.0.1:8000")
    spawn = ["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"]
    assert identify(spawn, {}, config) is None
    assert identify(["bash", "-c", "python train.py"], {}, config) is None


def test_allocation_strings() -> None:
    assert parse_allocation("fsdp:d2p1t1").world_size == 2
    assert parse_allocation("sglang:d4t2").world_size == 8
    assert parse_allocation("sglang:d4t2").instance_size == 2
    assert parse_allocation("megatron:(attn:d1p1t2|ffn:d1p1e2)") is None


def test_the_dry_run_shows_each_mode(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """One plan per mode: what the dry run prints is what runs."""
    common = [f"cluster.fileroot={tmp_path}", "--dry-run"]
    assert main(["--watchdog", "local", str(CONFIG), *common]) == 0
    plan = capsys.readouterr().out
    assert "process `controller` (job)" in plan and "gsm8k_rl.py --config" in plan
    assert "AREAL_WATCHDOG_RANK_ROLE=actor" in plan and "rank/sitehook" in plan
    assert "torch.distributed.run" not in plan
    assert main(["--watchdog", "local", str(CONFIG), "launch.mode=spmd", *common]) == 0
    plan = capsys.readouterr().out
    assert "-m areal.infra.launcher.sglang_server" in plan
    assert "starts after: 1 entry in" in plan and "AREAL_LLM_SERVER_ADDRS=<their values>" in plan
    assert "AREAL_SPMD_MODE=1" in plan


def test_a_scheduler_that_contradicts_the_backend_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["local", str(CONFIG), f"cluster.fileroot={tmp_path}", "scheduler.type=ray"])
    assert code == 2
    err = capsys.readouterr().err
    assert "scheduler.type" in err and "'ray'" in err and "Traceback" not in err


@needs_areal
def test_the_trajectory_hook_leaves_an_unknown_trainer_alone(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trainer loop that is not AReaL 1.0's (here: one that never calls prepare_batch), or
    another AReaL version: one line, and the trainer is not touched."""
    from areal.trainer.rl_trainer import PPOTrainer

    from areal_watchdog.rank.areal_hooks import areal_trajectory

    class Trainer:
        def train(self) -> str:
            return "trained"

        def _init_rollout(self, rollout_config: object, is_eval: bool = False) -> None:
            return None

    monkeypatch.delenv("AREAL_WATCHDOG_REPLAY_DIR", raising=False)
    module = types.ModuleType("areal.trainer.rl_trainer")
    module.PPOTrainer = Trainer
    original = Trainer.train
    areal_trajectory._patch(module)
    assert Trainer.train is original and Trainer().train() == "trained"
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "trajectory dumping off, training goes on: PPOTrainer.train no longer calls" in err
    assert areal_trajectory.mismatch(PPOTrainer, "1.0.4") is None
    assert areal_trajectory.mismatch(PPOTrainer, "2.0.0") is None
    assert "AReaL 3.1.0 is not one areal-watchdog knows" in areal_trajectory.mismatch(
        PPOTrainer, "3.1.0"
    )


def test_planning_an_areal_launch_leaves_the_config_as_written(tmp_path: Path) -> None:
    """The plan edits AReaL's tree (scheduler, fileroot) on a copy: the config the dumps are
    hashed from, and a replay starts again from, is the one the user wrote."""
    config = load_config(CONFIG, [f"cluster.fileroot={tmp_path}"])
    written = copy.deepcopy(config.raw)
    LocalBackend().plan(config, watchdog=True)
    assert config.raw == written
