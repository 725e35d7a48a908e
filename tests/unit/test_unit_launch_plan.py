"""The pieces every backend's plan is made of, as plain data: what ``--dry-run`` prints of a
LaunchPlan, the torchrun line, the rank command and environment, the run directory a launch
prepares, the gate before SPMD's trainer, the base Recovery's answers, and how a backend is
found by name. No process of a job starts here."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from areal_watchdog.common.errors import UserError
from areal_watchdog.common.secrets.mask import Mask
from areal_watchdog.common.secrets.redact import REDACTED
from areal_watchdog.config.load import load_config
from areal_watchdog.launch.backend import BACKENDS, backend_class, backend_names
from areal_watchdog.launch.local import LocalBackend
from areal_watchdog.launch.planning.gate import pass_gate, registered
from areal_watchdog.launch.planning.job import (
    job_environment,
    masked_names,
    prepare_run_dir,
    rank_command,
    stale_state,
    stored_env,
)
from areal_watchdog.launch.planning.plan import Gate, LaunchPlan, ProcessSpec
from areal_watchdog.launch.planning.torchrun import multi_node, standalone, torchrun_command
from areal_watchdog.launch.processes import Interrupts, OutputPump
from areal_watchdog.launch.recovery import Recovery
from areal_watchdog.rundir.layout import ENV_NODE, ENV_RUN_ID, ENV_WATCH_DIR, RunLayout
from testkit.launcher import DEMO_CONFIG

SECRET = "sk-live-0123456789abcdef"


def plan_of(run_dir: Path, files: dict[str, str], reset: list[str]) -> LaunchPlan:
    server = ProcessSpec("servers", ["srv", "--port", "1"], kind="service", log="/logs/srv.log")
    gate = Gate("/nr/gen_servers", 2, 30, "AREAL_LLM_SERVER_ADDRS")
    job = ProcessSpec("trainer", ["python", "my train.py"], {"WANDB_API_KEY": SECRET, "A": "1"},
                      cwd="/work", after=gate)  # fmt: skip
    return LaunchPlan("local", "r1", str(run_dir), files, [server, job], reset_paths=reset,
                      notes=["a note for the user"], dirs=["/nr"])  # fmt: skip


def test_the_dry_run_text_shows_every_process_file_and_note_and_no_secret(
    tmp_path: Path,
) -> None:
    plan = plan_of(tmp_path, {str(tmp_path / "launch.json"): "{}\n"}, [str(tmp_path / "old")])
    assert plan.main().name == "trainer" and [p.name for p in plan.of_kind("service")] == [
        "servers"
    ]
    shown = plan.render()
    head = f"backend:   local\nmode:      torchrun\nrun id:    r1\nrun dir:   {tmp_path}\n"
    assert shown.startswith(head)
    assert "`servers` (service):\n  command: srv --port 1\n  output:  /logs/srv.log" in shown
    assert "  command: python 'my train.py'\n  cwd:     /work" in shown  # as a shell reads it
    assert "starts after: 2 entries in /nr/gen_servers (up to 30 s)" in shown
    assert f"{tmp_path / 'launch.json'} (3 bytes)" in shown
    assert "directories to create:\n  /nr" in shown
    assert f"stale state to remove first:\n  {tmp_path / 'old'}" in shown
    assert shown.endswith("\n\na note for the user")
    assert SECRET not in shown and f"WANDB_API_KEY={REDACTED}" in shown and "    A=1" in shown


def test_one_gate_entry_is_said_in_the_singular() -> None:
    said = Gate("/d", 1, 1200, "ADDRS").render()
    assert said == "starts after: 1 entry in /d (up to 1200 s); ADDRS=<their values>"


def test_a_backend_is_found_by_name_and_an_unknown_name_lists_the_installed_ones() -> None:
    assert backend_names()[:3] == ["local", "slurm", "ray"] and set(BACKENDS) <= set(
        backend_names()
    )
    assert backend_class("local") is LocalBackend
    assert backend_class("ray").name == "ray" and backend_class("slurm").name == "slurm"
    with pytest.raises(UserError) as raised:
        backend_class("kubernetes")
    assert str(raised.value).startswith("no backend named 'kubernetes' (installed: local, slurm")


def test_torchrun_tees_only_local_rank_0_and_logs_each_node_apart(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    rank = ["-m", "areal_watchdog.rank.main", "train.py"]
    one = torchrun_command("py", layout, "n1", 4, standalone(), rank)
    assert one[:3] == ["py", "-m", "torch.distributed.run"]
    assert one[3:6] == ["--standalone", "--nnodes", "1"]
    assert one[one.index("--nproc-per-node") + 1] == "4"
    assert one[one.index("--log-dir") + 1] == str(layout.torchrun_logs_dir / "n1")
    assert one[one.index("--local-ranks-filter") + 1] == "0"
    assert one[-3:] == rank  # the rank command last: torchrun passes nothing after it
    many = multi_node(2, "$SLURM_NODEID", "node1", "29500")
    assert many == ["--nnodes", "2", "--node-rank", "$SLURM_NODEID", "--master-addr", "node1",
                    "--master-port", "29500"]  # fmt: skip


def test_the_ranks_run_under_the_wrapper_only_when_watched(tmp_path: Path) -> None:
    config = load_config(DEMO_CONFIG, [f"cluster.fileroot={tmp_path}", "+launch.env.TOKEN=abc"])
    layout = RunLayout(config.run_dir)
    watched = rank_command(config, layout, watchdog=True)
    assert watched[:2] == ["-m", "areal_watchdog.rank.main"] and watched[2].endswith("train.py")
    assert rank_command(config, layout, watchdog=False) == watched[2:]
    env = job_environment(config, layout, "r9", "n1", watchdog=True)
    assert (env[ENV_RUN_ID], env[ENV_NODE]) == ("r9", "n1")
    assert env[ENV_WATCH_DIR] == str(layout.watch_dir)
    plain = job_environment(config, layout, "r9", "n1", watchdog=False)
    assert ENV_RUN_ID not in plain and plain["TOKEN"] == "abc"  # launch.env, unwatched too
    assert ENV_NODE not in job_environment(config, layout, "r9", None, watchdog=True)  # Slurm


def test_a_secret_of_launch_env_is_masked_and_never_stored() -> None:
    env = {"WANDB_API_KEY": "short", "HOOK": "https://hooks.slack.com/services/T0/B0/XXXXXXXXXXXX",
           "LR": "0.1"}  # fmt: skip
    assert masked_names(env) == ["WANDB_API_KEY", "HOOK"]
    assert stored_env(env) == {"WANDB_API_KEY": REDACTED, "HOOK": REDACTED, "LR": "0.1"}


def test_preparing_the_run_dir_removes_stale_state_without_following_a_link(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "root" / "exp" / "trial"
    layout = RunLayout(run_dir)
    outside = tmp_path / "precious.json"
    outside.write_text("keep me")
    layout.watch_dir.mkdir(parents=True)
    layout.cancel_file.symlink_to(outside)  # planted where the last launch's cancel was
    (layout.heartbeats_dir).mkdir()
    (layout.heartbeats_dir / "rank_0.step_3.old").write_text("")
    assert {layout.cancel_file, layout.heartbeats_dir, layout.recovery_file} <= set(
        stale_state(layout)
    )
    files = {str(layout.launch_file): '{"run_id": "r1"}'}
    plan = plan_of(run_dir, files, [str(p) for p in stale_state(layout)])
    assert prepare_run_dir(plan) is None  # no lock asked for
    assert outside.read_text() == "keep me" and not layout.cancel_file.is_symlink()
    assert list(layout.heartbeats_dir.iterdir()) == []  # emptied, made again
    assert layout.launch_file.read_text() == '{"run_id": "r1"}'
    assert all(d.is_dir() for d in layout.live_dirs())


def test_the_gate_opens_with_the_servers_values_and_says_why_it_gave_up(tmp_path: Path) -> None:
    for name, value in (("b", "10.0.0.2:3000"), ("a", "10.0.0.1:3000"), ("c", "")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "ENTRY").write_text(value + "\n")
    assert registered(tmp_path) == ["10.0.0.1:3000", "10.0.0.2:3000"]  # an empty entry: none
    said: list[str] = []
    gate = Gate(str(tmp_path), 2, 5, "ADDRS")
    assert pass_gate(gate, lambda: None, said.append) == {"ADDRS": "10.0.0.1:3000,10.0.0.2:3000"}
    assert said[-1] == "ADDRS=10.0.0.1:3000,10.0.0.2:3000"
    said.clear()
    three = Gate(str(tmp_path), 3, 5, "ADDRS")
    assert pass_gate(three, lambda: "a server died", said.append) is None
    assert said[-1] == f"cannot start the job: 3 server(s) expected in {tmp_path}, a server died"
    assert pass_gate(Gate(str(tmp_path), 3, 0, "ADDRS"), lambda: None, said.append, 0.01) is None
    assert said[-1].endswith("not there after 0 s")


def test_the_base_recovery_resumes_here_and_leaves_no_node_out() -> None:
    config = load_config(DEMO_CONFIG, [])
    recovery = Recovery()
    assert recovery.refusal(config, "torchrun") is None
    assert recovery.replay_host(config, {"n1"}) is None  # in this process
    assert recovery.known_nodes({"n1"}) == set() and not recovery.leaves_out_nodes()
    assert recovery.without_nodes(config, {"n1"}) is config
    assert recovery.allocation() is None
    assert recovery.dry_run(config, "torchrun") == ("on this node", [])


def test_the_output_pump_masks_every_line_and_a_muted_pump_keeps_only_the_log(
    tmp_path: Path,
) -> None:
    source, out, log = tmp_path / "src", tmp_path / "out", tmp_path / "log"
    source.write_text(f"step 1\ntoken {SECRET}\n")
    with source.open() as src, out.open("w") as to_out, log.open("w") as to_log:
        OutputPump(src, to_out, to_log, Mask([SECRET])).thread.join(5)
    assert out.read_text() == log.read_text() == "step 1\ntoken ***\n"
    read, write = os.pipe()  # muted before the job says a word (after a cancel)
    with os.fdopen(read) as src, out.open("w") as to_out, log.open("w") as to_log:
        pump = OutputPump(src, to_out, to_log, Mask())
        pump.mute()
        with os.fdopen(write, "w") as job:
            job.write(source.read_text())
        pump.thread.join(5)
    assert out.read_text() == "" and log.read_text() == f"step 1\ntoken {SECRET}\n"


def test_a_second_interrupt_means_now_and_the_handlers_are_given_back() -> None:
    before = signal.getsignal(signal.SIGHUP)
    interrupts, now = Interrupts(), []
    interrupts.on_second = lambda: now.append(True)
    try:
        signal.raise_signal(signal.SIGHUP)
        assert (interrupts.count, now) == (1, [])  # the first: stop in order
        signal.raise_signal(signal.SIGINT)
        assert (interrupts.count, now) == (2, [True])
    finally:
        interrupts.restore()
    assert signal.getsignal(signal.SIGHUP) == before
