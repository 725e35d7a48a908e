"""Slurm's pieces that need no cluster: ``launch.slurm`` checked key by key, the recovery's
answers read from the backend's state at each question, and the verbs a sidecar runs through
``scheduler_command``. Where a Slurm client command is run, a tiny fake stands first (alone) on
PATH and logs what it was asked; the real Slurm is never reached."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from areal_watchdog.common.errors import ConfigError
from areal_watchdog.config.load import load_config
from areal_watchdog.config.model import ResumeSection, WatchdogSection
from areal_watchdog.launch.exit_codes import ExitCode
from areal_watchdog.launch.slurm import node
from areal_watchdog.launch.slurm.control.jobs import wait_for_job
from areal_watchdog.launch.slurm.options import container_prefix, parse_time_minutes, validate_slurm
from areal_watchdog.launch.slurm.recovery import SlurmRecovery
from areal_watchdog.launch.slurm.scheduler_command import main
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import RunLayout
from testkit.launcher import DEMO_CONFIG

FAKE_SLURM = """
import os, sys
name = os.path.basename(sys.argv[0])
with open(os.environ["FAKE_SLURM_LOG"], "a") as log:
    log.write(" ".join([name, *sys.argv[1:]]) + "\\n")
if name == "scontrol":
    print("node1\\nnode2")
elif name == "sinfo":
    print("node1\\nnode2\\nnode3")
elif name == "squeue" and "-s" in sys.argv:
    print("77.batch\\n77.0\\n77.1\\n770.0")
elif name == "squeue":
    print("77 hang-demo_t:actor\\n78 someone-else:actor\\n79 hang-demo_t:rollout")
"""


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """scontrol, sinfo, squeue and scancel as one logging script; the log's path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("scontrol", "sinfo", "squeue", "scancel"):
        (bin_dir / name).write_text(f"#!{sys.executable}\n{FAKE_SLURM}")
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "slurm.log"
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FAKE_SLURM_LOG", str(log))
    return log


def asked(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def run_dir_of(tmp_path: Path, dynamic: bool = False, allocation: str = "new") -> Path:
    run_dir = tmp_path / "run"
    RunLayout(run_dir).watch_dir.mkdir(parents=True)
    info = LaunchInfo(
        run_id="r1", backend="slurm", run_dir=str(run_dir), world_size=2, nodes=["n1"],
        nproc_per_node=1, experiment_name="hang-demo", trial_name="t", fileroot=str(tmp_path),
        watchdog=WatchdogSection(on_hang="resume", resume=ResumeSection(allocation=allocation)),
        dynamic_nodes=dynamic,
    )  # fmt: skip
    RunLayout(run_dir).launch_file.write_text(json.dumps(info.to_dict()))
    return run_dir


# ------------------------------------------------------------------ launch.slurm options
@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("+launch.slurm.partition=5", "`launch.slurm.partition`: must be a str, got 5"),
        ("+launch.slurm.cpus_per_task=true", "`launch.slurm.cpus_per_task`: must be a int, got "
         "True"),
        ("+launch.slurm.srun_args=--mpi", "`launch.slurm.srun_args`: must be a list, got '--mpi'"),
        ("+launch.slurm.time=0", "`launch.slurm.time`: must be at least 1 minute, got 0"),
        ("+launch.slurm.time='0:00'", "`launch.slurm.time`: must be at least 1 minute, got '0:00'"),
    ],
)  # fmt: skip
def test_a_bad_slurm_value_is_one_line_naming_the_file_and_the_key(
    override: str, said: str
) -> None:
    config = load_config(DEMO_CONFIG, [override])
    with pytest.raises(ConfigError) as raised:
        validate_slurm(config)
    assert str(raised.value) == f"{DEMO_CONFIG}: {said}"


@pytest.mark.parametrize(
    ("value", "minutes"),
    [(90, 90), ("90", 90), ("1:30:00", 90), ("2:00", 2), ("5:30", 6), ("1-00:00:00", 1440),
     ("1-12", 2160), ("1-12:30", 2190), ("00:00:30", 1), ("0:10:01", 11)],
)  # fmt: skip
def test_slurm_time_reads_as_whole_minutes_rounded_up(value: int | str, minutes: int) -> None:
    assert parse_time_minutes(value, "c.yaml") == minutes


def test_valid_slurm_options_come_back_with_the_time_in_minutes() -> None:
    config = load_config(DEMO_CONFIG, ["+launch.slurm.time='1:00:00'", "+launch.slurm.mem=64G"])
    assert validate_slurm(config) == {"time": 60, "mem": "64G"}
    assert validate_slurm(load_config(DEMO_CONFIG, []))["time"] == 60  # the default
    assert dict(config.launch.slurm)["time"] == "1:00:00"  # the config stays as written


def test_a_container_prefix_is_split_as_a_shell_would() -> None:
    assert container_prefix({"container_prefix": "apptainer exec 'my img.sif'"}) == [
        "apptainer", "exec", "my img.sif"
    ]  # fmt: skip
    assert container_prefix({"container_prefix": ["enroot", 1]}) == ["enroot", "1"]
    assert container_prefix({}) == []


# ------------------------------------------------------------------ SlurmRecovery
@dataclass
class Submitted:
    """What SlurmRecovery reads of the backend: ``--wait``, and the job kept for a resume."""

    wait: bool = False
    allocation: str | None = None


def test_slurm_s_recovery_answers_from_the_backend_as_it_is_at_each_question() -> None:
    config = load_config(DEMO_CONFIG, ["watchdog.on_hang=resume", "+launch.slurm.exclude=node9"])
    backend = Submitted()
    recovery = SlurmRecovery(backend)
    assert "add --wait" in recovery.refusal(config, "torchrun")
    assert recovery.refusal(config, "single_controller") is None  # the controller runs here
    backend.wait = True  # --wait parsed after the recovery was made
    assert recovery.refusal(config, "spmd") is None
    assert recovery.leaves_out_nodes() and recovery.allocation() == "new"
    resumed = recovery.without_nodes(config, {"node2", "node1"})
    assert resumed.launch.slurm["exclude"] == "node1,node2,node9"
    assert config.launch.slurm["exclude"] == "node9"  # the config stays as written
    assert recovery.without_nodes(config, set()) is config
    backend.allocation = "41"  # allocation: same, the job kept after a hang
    assert not recovery.leaves_out_nodes() and recovery.allocation() == "same (job 41)"


def test_slurm_s_dry_run_says_where_the_replay_and_the_resume_run() -> None:
    recovery = SlurmRecovery(Submitted(wait=True))
    new = load_config(DEMO_CONFIG, ["watchdog.on_hang=resume"])
    where, lines = recovery.dry_run(new, "single_controller")
    assert where == "on a node of a one-node Slurm allocation the hangs did not name"
    assert lines == ["  AReaL's jobs submitted again (their scheduling_spec's exclude) without the "
                     "nodes a transient hang named"]  # fmt: skip
    same = load_config(DEMO_CONFIG, ["watchdog.on_hang=resume", "+watchdog.resume.allocation=same"])
    where, (line,) = recovery.dry_run(same, "torchrun")
    assert where.startswith("on a node of the job's allocation the hangs did not name (else on")
    assert "as a new step of the same allocation" in line and "is not left out" in line
    said = recovery.refusal(same, "single_controller")
    assert said is not None and "use allocation: new" in said


def test_only_the_nodes_slurm_knows_are_left_out(fake_slurm: Path) -> None:
    recovery = SlurmRecovery(Submitted(wait=True))
    assert recovery.known_nodes(set()) == set() and asked(fake_slurm) == []  # not even asked
    assert recovery.known_nodes({"node2", "login7"}) == {"node2"}  # sbatch refuses login7
    assert asked(fake_slurm) == ["sinfo -h -N -o %N"]


# ------------------------------------------------------------------ scheduler_command verbs
def test_an_unknown_verb_is_exit_2_and_one_line(
    tmp_path: Path, fake_slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = run_dir_of(tmp_path)
    assert main(["restart", str(run_dir)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "cannot: unknown verb 'restart' (where, end-job, orphaned)\n"
    assert main(["end-job", str(tmp_path / "nowhere"), "77", "cancel"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("cannot: ") and "no readable watchdog/launch.json" in line
    assert asked(fake_slurm) == []


def test_a_job_id_that_is_not_slurm_s_never_reaches_scancel(
    tmp_path: Path, fake_slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["end-job", str(run_dir_of(tmp_path)), "--user=root", "cancel"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "'--user=root' is not a Slurm job id" in line
    assert asked(fake_slurm) == []


def test_end_job_cancels_the_job_or_with_a_kept_allocation_only_its_steps(
    tmp_path: Path, fake_slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = run_dir_of(tmp_path)
    assert main(["end-job", str(new), "77", "resume"]) == 0
    assert capsys.readouterr().out == "scancel 77\n"
    same = run_dir_of(tmp_path / "same", allocation="same")
    assert main(["end-job", str(same), "77", "resume"]) == 0
    assert capsys.readouterr().out == "scancel 77.0 77.1\n"  # not the batch script, not job 770
    assert main(["end-job", str(same), "77", "cancel"]) == 0  # a cancel ends the whole job
    assert capsys.readouterr().out == "scancel 77\n"
    assert asked(fake_slurm)[-1] == "scancel 77"


def test_orphaned_cancels_areal_s_jobs_of_the_run_and_nothing_else(
    tmp_path: Path, fake_slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["orphaned", str(run_dir_of(tmp_path))]) == 0  # a torchrun job: nothing to do
    assert capsys.readouterr().out == "\n" and asked(fake_slurm) == []
    areal = run_dir_of(tmp_path / "areal", dynamic=True)
    assert main(["orphaned", str(areal)]) == 0
    assert capsys.readouterr().out == "cancelled AReaL's Slurm jobs 77, 79\n"
    assert asked(fake_slurm)[-1] == "scancel 77 79"


def test_where_says_the_node_the_job_s_nodes_and_the_job_id(
    fake_slurm: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "node2")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert main(["where", "unused"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said == {"node": "node2", "nodes": ["node1", "node2"], "job_id": "77"}
    assert asked(fake_slurm) == ["scontrol show hostnames node[1-2]"]
    monkeypatch.delenv("SLURMD_NODENAME")  # not in a Slurm task
    assert main(["where", "unused"]) == 2
    assert capsys.readouterr().err == "cannot: 'SLURMD_NODENAME'\n"


# ------------------------------------------------------------------ a controller that is silent
ANSWERING_SCONTROL = """
import os, sys
answers = open(os.environ["FAKE_ANSWERS"]).read().split("\\n---\\n")
count = os.environ["FAKE_ANSWERS"] + ".asked"
n = int(open(count).read()) if os.path.exists(count) else 0
open(count, "w").write(str(n + 1))
answer = answers[min(n, len(answers) - 1)]
if answer.startswith("ERR "):
    sys.exit(print(answer[4:], file=sys.stderr) or 1)
print(answer)
"""
TIMED_OUT = "ERR slurm_load_jobs error: Socket timed out on send/recv operation"


@pytest.fixture
def answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., int]:
    """An scontrol that gives the answers it is handed, one a call, the last one again."""
    bin_dir = tmp_path / "answering"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!{sys.executable}\n{ANSWERING_SCONTROL}")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FAKE_ANSWERS", str(tmp_path / "answers"))
    return lambda *said: (tmp_path / "answers").write_text("\n---\n".join(said))


def test_wait_sits_out_a_silent_controller_and_says_so_once(
    tmp_path: Path, answers: Callable[..., int]
) -> None:
    answers("JobId=77 JobState=RUNNING", TIMED_OUT, TIMED_OUT, TIMED_OUT,
            "JobId=77 JobState=COMPLETED")  # fmt: skip
    said: list[str] = []
    assert wait_for_job("77", run_dir_of(tmp_path), poll=0, out=said.append) == ExitCode.OK
    assert said[0] == "[areal-launch] job 77: RUNNING" and said[-1].endswith("job 77: COMPLETED")
    (silent,) = [line for line in said if "has not answered" in line]
    assert "Socket timed out on send/recv operation); waiting for it" in silent
    assert [line for line in said if "answers again after" in line]


def test_a_job_the_controller_forgot_fails_the_wait_and_says_what_is_known(
    tmp_path: Path,
    answers: Callable[..., int],
) -> None:
    answers("ERR slurm_load_jobs error: Invalid job id specified")
    said: list[str] = []
    run_dir = run_dir_of(tmp_path)
    assert wait_for_job("77", run_dir, poll=0, out=said.append) == ExitCode.JOB_FAILED
    assert said[0] == "[areal-launch] job 77: UNKNOWN"
    assert said[1].startswith("[areal-launch] job 77 UNKNOWN: no node recorded its part's end")
    assert f"logs: {run_dir}/watchdog/logs/submitit/77_*_log.out" in said[1]


def test_the_first_node_s_address_is_asked_again_then_its_name_stands_in(
    answers: Callable[..., int],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(node, "ADDRESS_RETRY", 0)
    monkeypatch.setenv("SLURMD_NODENAME", "node2")
    answers(TIMED_OUT, TIMED_OUT, "NodeName=node1 Arch=x86_64 NodeAddr=10.0.0.7 NodeHostName=n1")
    assert node.node_address("node1", patience=30) == "10.0.0.7"
    assert capsys.readouterr().out == ""
    answers(TIMED_OUT)
    assert node.node_address("node1", patience=0) == "node1"
    assert capsys.readouterr().out == (
        "[areal-launch node2] scontrol show node node1: slurm_load_jobs error: Socket timed out "
        "on send/recv operation; the rendezvous uses the name node1\n"
    )
