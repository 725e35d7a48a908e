"""AReaL's two modes as plans (``launch.planning.areal``, ``launch.slurm.areal``): the processes,
the edits of the config AReaL reads, and the one-line refusals naming the config file and key.
Nothing runs: the plans only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from areal_watchdog.common.errors import ConfigError
from areal_watchdog.config.load import load_config
from areal_watchdog.launch.planning.areal import plan_areal, script_command
from areal_watchdog.launch.planning.job import job_environment
from areal_watchdog.launch.slurm.areal import job_prefix, plan_single_controller
from areal_watchdog.launch.slurm.scheduler_command import MODULE
from areal_watchdog.rank.sitehook import DIRECTORY as SITEHOOK
from areal_watchdog.rundir.layout import ENV_JOB_CONFIG, ENV_RANK_ROLE, RunLayout
from conftest import REPO

AREAL = REPO / "examples" / "areal" / "gsm8k_grpo.yaml"


def areal_plan(tmp_path: Path, overrides: list[str], mode: str, watchdog: bool = True):
    config = load_config(AREAL, [f"cluster.fileroot={tmp_path}", *overrides])
    layout = RunLayout(config.run_dir.resolve())
    env = job_environment(config, layout, "r1", "n1", watchdog)
    return config, layout, plan_areal(config, mode, "local", layout, env, ["train"], "n1")


def test_spmd_gives_the_servers_their_gpus_then_the_trainer_the_next_ones(tmp_path: Path) -> None:
    """One node: the servers first (rollout's allocation), the trainer after them, started only
    once every server data-parallel rank registered."""
    overrides = ["cluster.n_gpus_per_node=4", "rollout.backend=sglang:d2", "actor.backend=fsdp:d2"]
    config, layout, job = areal_plan(tmp_path, overrides, "spmd")
    servers, trainer = job.processes
    assert (servers.kind, trainer.kind) == ("service", "job")
    assert servers.argv[1:3] == ["-m", "areal.infra.launcher.sglang_server"]
    assert servers.argv[-1] == "++cluster.n_gpus_per_node=2"
    assert servers.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert trainer.env["CUDA_VISIBLE_DEVICES"] == "2,3" and trainer.env["AREAL_SPMD_MODE"] == "1"
    assert trainer.after is not None and trainer.after.count == 2
    assert trainer.after.env_var == "AREAL_LLM_SERVER_ADDRS"
    assert trainer.after.directory.startswith(f"{tmp_path}/name_resolve/")
    assert job.world_size == 2 and job.rank_role is None
    assert job.reset_paths == [str(Path(trainer.after.directory).parent)]  # this trial's records
    assert job.tree["allocation_mode"] == "sglang:d2+fsdp:d2"
    assert config.raw["actor"]["backend"] == "fsdp:d2" and "allocation_mode" not in config.raw


def test_the_single_controller_runs_the_script_with_the_hook_and_the_actor_role(
    tmp_path: Path,
) -> None:
    config, layout, job = areal_plan(tmp_path, [], "single_controller")
    (controller,) = job.processes
    assert controller.argv == script_command(config, layout)
    assert controller.argv[-2:] == ["--config", str(layout.job_config)]
    assert controller.env[ENV_RANK_ROLE] == "actor" and job.rank_role == "actor"
    assert controller.env["PYTHONPATH"].split(":")[0] == SITEHOOK  # AReaL passes it on
    assert controller.env[ENV_JOB_CONFIG] == str(layout.job_config)
    assert job.tree["scheduler"]["type"] == "local" and job.tree["cluster"]["fileroot"] == str(
        tmp_path
    )


def test_an_unwatched_areal_job_keeps_the_pythonpath_of_launch_env(tmp_path: Path) -> None:
    config, _, job = areal_plan(tmp_path, [], "single_controller", watchdog=False)
    (controller,) = job.processes
    assert ENV_JOB_CONFIG not in controller.env and ENV_RANK_ROLE not in controller.env
    assert controller.env.get("PYTHONPATH") == config.launch.env["PYTHONPATH"]


@pytest.mark.parametrize(
    ("overrides", "mode", "key", "words"),
    [
        (["rollout.backend=trtllm:d1"], "spmd", "rollout.backend", "SPMD needs an inference "
         "backend of sglang, vllm, got 'trtllm'"),
        (["actor.backend=fsdp"], "spmd", "actor.backend", "needs an allocation like 'fsdp:d2'"),
        (["cluster.name_resolve.type=etcd3"], "single_controller", "cluster.name_resolve.type",
         "use nfs, got 'etcd3'"),
        (["scheduler.type=slurm"], "single_controller", "scheduler.type",
         "is 'slurm' but this is `areal-launch local`: set local or null"),
    ],
)  # fmt: skip
def test_what_areal_cannot_be_launched_with_names_the_file_and_the_key(
    tmp_path: Path, overrides: list[str], mode: str, key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        areal_plan(tmp_path, overrides, mode)
    assert raised.value.key == key
    said = str(raised.value)
    assert said.startswith(f"{AREAL}: `{key}`: ") and words in said and "\n" not in said


def test_slurm_s_single_controller_plan_reaches_every_role_through_its_scheduling_spec(
    tmp_path: Path,
) -> None:
    """The controller and its sidecar here; every role's spec gets the standby sidecar and the
    nodes to leave out (beside the spec's own), and launch.json the command a sidecar asks
    Slurm with. The config stays as written."""
    overrides = ["+launch.slurm.exclude=node9,node2", "+actor.scheduling_spec.0.exclude=node5"]
    config = load_config(AREAL, [f"cluster.fileroot={tmp_path}", *overrides])
    written = json.dumps(config.raw, sort_keys=True)
    plan = plan_single_controller(config, watchdog=True, run_id="r7")
    assert (plan.backend, plan.mode, plan.run_id, plan.payload) == (
        "slurm", "single_controller", "r7", "gsm8k-grpo_trial0:"
    )  # fmt: skip
    assert [p.kind for p in plan.processes] == ["job", "watchdog"]
    layout = RunLayout(Path(plan.run_dir))
    tree = yaml.safe_load(plan.files[str(layout.job_config)])
    assert tree["scheduler"]["type"] == "slurm" and tree["cluster"]["n_gpus_per_node"] == 1
    actor, rollout = tree["actor"]["scheduling_spec"][0], tree["rollout"]["scheduling_spec"][0]
    assert actor["exclude"] == rollout["exclude"] == "node2,node5,node9"  # rollout's is actor's
    for spec in (actor, rollout):
        (standby,) = spec["additional_bash_cmds"]
        assert "--node-from-scheduler --standby" in standby and standby.endswith("& }")
    info = json.loads(plan.files[str(layout.launch_file)])
    assert info["scheduler_command"] == [config.launch.python, "-m", MODULE]
    assert info["dynamic_nodes"] is True and info["nproc_per_node"] == 0
    assert "cluster.n_gpus_per_node: 1 for AReaL (its Slurm scheduler divides by it)" in plan.notes
    assert "AReaL's jobs exclude node(s) node9,node2 (launch.slurm.exclude)" in plan.notes
    assert f"AReaL's jobs: {job_prefix(config)}<role>" in plan.render()
    assert json.dumps(config.raw, sort_keys=True) == written
    assert not Path(plan.run_dir).exists()  # a plan creates nothing


def test_slurm_s_single_controller_plan_unwatched_adds_no_sidecar(tmp_path: Path) -> None:
    config = load_config(AREAL, [f"cluster.fileroot={tmp_path}"])
    plan = plan_single_controller(config, watchdog=False, run_id=None)
    assert [p.kind for p in plan.processes] == ["job"] and len(plan.run_id) == 12
    tree = yaml.safe_load(plan.files[str(RunLayout(Path(plan.run_dir)).job_config)])
    assert "additional_bash_cmds" not in tree["actor"]["scheduling_spec"][0]
    assert not any("additional_bash_cmds" in note for note in plan.notes)
