"""``areal-launch doctor``: each check's logic on recorded or constructed inputs, one real run on
this machine, and the hint a launch's ``--dry-run`` gives when a check would fail."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from areal_watchdog import cli
from areal_watchdog.config.sinks import SinkSpec
from areal_watchdog.doctor import command, hint, slurm
from areal_watchdog.doctor.checks import areal_hooks, filesystem, gpus, ptrace
from areal_watchdog.doctor.checks.flight_recorder import judge as judge_fr
from areal_watchdog.doctor.checks.sinks import check_sink
from areal_watchdog.doctor.model import FAIL, PASS, WARN, Check, NodeReport, NodeSpec
from areal_watchdog.doctor.node import MARKER
from areal_watchdog.doctor.render import merge, render

REPO = Path(__file__).resolve().parents[1]
AREAL2_PYTHON = REPO / ".venv-areal2" / "bin" / "python"
HOST_STATUS = "Name:\tpython3\nCapInh:\t0000000000000000\nCapEff:\t000001fffeffffff\n"
DOCKER_STATUS = "Name:\tpython3\nCapEff:\t00000000a80425fb\n"  # docker's default set
MOUNTS = """\
overlay / overlay rw,relatime,lowerdir=/a 0 0
server:/export /mnt/shared nfs4 rw,vers=4.2,addr=10.0.0.1 0 0
user@host:/data /mnt/shared/sshfs fuse.sshfs rw,nosuid 0 0
/dev/sda1 /scratch\\040disk ext4 rw 0 0
"""


def test_ptrace_policy_by_yama_scope_and_capability() -> None:
    cap = 1 << ptrace.CAP_SYS_PTRACE
    assert ptrace.yama_scope("1\n") == 1 and ptrace.yama_scope(None) is None
    assert ptrace.effective_caps(HOST_STATUS) & cap
    assert not ptrace.effective_caps(DOCKER_STATUS) & cap
    assert ptrace.policy(None, cap, None, 0).status == PASS
    scope1 = ptrace.policy(1, 0, None, 1000)
    assert scope1.status == PASS and "PR_SET_PTRACER" in scope1.detail
    assert ptrace.policy(2, 0, None, 1000).status == FAIL
    assert ptrace.policy(2, cap, None, 0).status == PASS
    assert ptrace.policy(3, cap, None, 0).status == FAIL
    in_docker = ptrace.policy(None, ptrace.effective_caps(DOCKER_STATUS), "docker", 0)
    assert in_docker.status == WARN and "SYS_PTRACE" in in_docker.fix


def test_container_hints() -> None:
    assert ptrace.container_kind({"/.dockerenv": True}, "", "") == "docker"
    assert ptrace.container_kind({"/run/.containerenv": True}, "", "") == "podman"
    assert ptrace.container_kind({}, "0::/kubepods/burstable/pod1/abc\n", "") == "kubepods"
    assert ptrace.container_kind({}, "0::/\n", "") is None
    assert ptrace.container_kind({}, "", "systemd-nspawn") == "systemd-nspawn"


def test_mounts_nfs_fuse_and_local() -> None:
    mounts = filesystem.parse_mounts(MOUNTS)
    assert ("/scratch disk", "ext4") in mounts
    assert filesystem.mount_type("/mnt/shared/run", mounts) == ("/mnt/shared", "nfs4")
    assert filesystem.mount_type("/mnt/shared/sshfs/r", mounts)[1] == "fuse.sshfs"
    assert filesystem.mount_type("/mnt/sharedx", mounts) == ("/", "overlay")
    kinds = [filesystem.kind_of(t) for t in ("nfs4", "fuse.sshfs", "ext4", "lustre")]
    assert kinds == ["NFS", "FUSE", "local", "network"]
    assert filesystem.filesystem_check(Path("/mnt/shared/sshfs"), MOUNTS).status == WARN
    assert filesystem.filesystem_check(Path("/mnt/shared"), MOUNTS).status == PASS


def test_filesystem_checks_for_real(tmp_path: Path) -> None:
    checks = filesystem.check_filesystem(str(tmp_path / "not" / "made"))
    assert [c.name for c in checks] == ["run dir filesystem", "fifos", "atomic rename"]
    assert all(c.status == PASS for c in checks), checks
    assert list(tmp_path.iterdir()) == []  # cleaned up
    unshared = filesystem.check_filesystem(str(tmp_path), str(tmp_path / "launcher-only"))
    assert unshared[0].status == FAIL and "not shared" in unshared[0].detail


def _fake_areal(init_rollout_params: str) -> dict[str, object]:
    """The objects the hooks touch, as a fake AReaL with ``_init_rollout(init_rollout_params)``."""
    namespace: dict[str, object] = {}
    exec(f"def _init_rollout(self, {init_rollout_params}): pass", namespace)

    class PPOTrainer:
        _init_rollout = namespace["_init_rollout"]

        def __init__(self, config, train_dataset=None, valid_dataset=None): ...

        def train(self, workflow=None, eval_workflow=None, workflow_kwargs=None):
            return self.actor.prepare_batch()

    class InferenceEngine:
        def _resolve_workflow(self, workflow, workflow_kwargs, group_size=1): ...

        def rollout_batch(self, data, workflow, workflow_kwargs=None, group_size=1): ...

    class Engine:
        is_data_parallel_head = data_parallel_rank = data_parallel_world_size = None

        def prepare_batch(self, dataloader, workflow, workflow_kwargs, should_accept_fn=None): ...

    return {
        "areal.trainer.rl_trainer:PPOTrainer": PPOTrainer,
        areal_hooks.CONTROLLER: Engine,
        areal_hooks.ENGINE: Engine,
        areal_hooks.INF_ENGINE: InferenceEngine,
        "areal.infra.rpc.rtensor:RTensor": SimpleNamespace(localize=lambda batch: batch),
        "areal.infra.platforms:current_platform": object(),
        "areal.utils.data:tensor_container_to": lambda batch, device: batch,
    }


def test_areal_hook_signatures_against_a_fake_module() -> None:
    good = _fake_areal("rollout_config, is_eval=False, lora_path=None")
    results = areal_hooks.hook_results(good.__getitem__, lambda module: True)
    assert areal_hooks.judge(results).status == PASS
    bad = _fake_areal("config, evaluating=False")
    results = areal_hooks.hook_results(bad.__getitem__, lambda module: module.endswith("server"))
    check = areal_hooks.judge(results)
    assert check.status == FAIL and "_init_rollout" in check.detail and check.fix
    missing = areal_hooks.hook_results({}.__getitem__, lambda module: True)
    assert all(not r["ok"] and "KeyError" in r["why"] for r in missing[: len(areal_hooks.HOOKS)])


def test_gpus_warn_without_gpus_unless_asked() -> None:
    assert gpus.judge("none", 0, 0, "NVML Shared Library Not Found").status == WARN
    assert gpus.judge("none", 0, 8, None).status == FAIL
    assert gpus.judge("nvml", 4, 8, None).status == FAIL
    assert gpus.judge("nvml", 8, 8, None).status == PASS
    assert gpus.check_gpus("none", None, 8).status == PASS


def test_flight_recorder_probe_output() -> None:
    ok = '{"torch": "2.13.0", "json_entries": 1, "entries": 1}\n'
    off = '{"torch": "2.13.0", "json_entries": 0, "entries": 0}\n'
    assert judge_fr(ok, "").status == PASS
    assert judge_fr(off, "").status == FAIL
    crashed = judge_fr("", "Traceback...\nModuleNotFoundError: No module named 'torch'\n")
    assert crashed.status == FAIL and "torch" in crashed.detail


def test_sink_reachable_without_posting_and_without_secrets(monkeypatch) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    received: list[bytes] = []

    def accept() -> None:
        conn, _ = server.accept()
        with conn:
            received.append(conn.recv(1024))

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    secret_url = f"http://127.0.0.1:{server.getsockname()[1]}/hook/T0SECRETPATH?token=abc123456"
    monkeypatch.setenv("DOCTOR_TEST_URL", secret_url)
    spec = SinkSpec("webhook", "ops", {"url": {"env": "DOCTOR_TEST_URL"}})
    try:
        check = check_sink(spec)
        thread.join(5)
    finally:
        server.close()
    assert check.status == PASS and "nothing sent" in check.detail
    assert received == [b""]  # connected, then closed: no request
    assert "T0SECRETPATH" not in check.detail + check.fix
    unset = check_sink(SinkSpec("webhook", "ops", {"url": {"env": "DOCTOR_TEST_UNSET"}}))
    assert unset.status == FAIL and "DOCTOR_TEST_UNSET" in unset.detail


def test_clock_skew_and_the_job_table() -> None:
    reports = [
        NodeReport("node1", 100.0, [Check("gpus", PASS, "8 GPU(s)")]),
        NodeReport("node2", 100.4, [Check("gpus", FAIL, "0 GPU(s)", "install the driver")]),
    ]
    assert slurm.skew_check(reports).status == PASS
    assert slurm.skew_check(reports[:1]).detail == "single node"
    late = NodeReport("node3", 103.0, [])
    assert slurm.skew_check([*reports, late]).status == WARN
    assert slurm.skew_check([*reports, NodeReport("node4", 200.0, [])]).status == FAIL
    rows = merge(reports)
    assert [(c.status, nodes) for c, nodes in rows] == [(FAIL, ["node2"]), (PASS, ["node1"])]
    table = render(rows, 2, "doctor")
    assert "node2" in table and "fix: install the driver" in table
    assert "0 GPU(s)" in table and "1 pass, 0 warn, 1 fail" in table


def test_srun_step_and_its_reports() -> None:
    spec = NodeSpec(sys.executable, "/tmp/root", shared_dir="/tmp/root/.areal-doctor-x")
    argv = slurm.srun_command(spec, 2, {"srun_args": ["--mpi=none"]})
    assert argv[:6] == ["srun", "--overlap", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                        "--kill-on-bad-exit=0"]  # fmt: skip
    assert "--mpi=none" in argv and "areal_watchdog.doctor.node" in argv
    report = NodeReport("node1", 1.0, [Check("py-spy", PASS, "ok")])
    import json

    out = f"noise\n{MARKER}{json.dumps(report.to_dict())}\n{MARKER}{{broken\n"
    assert slurm.parse_reports(out) == [report]
    with pytest.raises(cli.UserError):
        slurm.allocated_nodes({})


def test_usage_errors_exit_2(monkeypatch, capsys) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert cli.main(["doctor", "--slurm"]) == 2
    assert cli.main(["doctor", "/nonexistent/config.yaml"]) == 2
    err = capsys.readouterr().err
    assert "salloc" in err and "no such config file" in err and "Traceback" not in err


def test_a_failing_check_exits_1(monkeypatch, capsys) -> None:
    broken = NodeReport("vm", 0.0, [Check("py-spy", FAIL, "not installed", "pip install py-spy")])
    monkeypatch.setattr(command, "run_node", lambda spec: broken)
    assert cli.main(["doctor"]) == 1
    assert "fix: pip install py-spy" in capsys.readouterr().out


def test_dry_run_mentions_doctor_once_when_a_check_would_fail(
    monkeypatch, capsys, tmp_path: Path
) -> None:
    launch = ["--watchdog", "local", str(REPO / "examples/hang_demo/config.yaml"), "--dry-run",
              f"cluster.fileroot={tmp_path}"]  # fmt: skip
    assert cli.main(launch) == 0
    assert "areal-launch doctor" not in capsys.readouterr().out  # nothing fails here
    monkeypatch.setattr(hint, "pyspy_executable", lambda: None)
    assert cli.main(launch) == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if "areal-launch doctor" in line]
    assert "py-spy is not installed" in line and line.count("doctor") == 1


def test_doctor_for_real_on_this_machine(tmp_path: Path) -> None:
    """Every check, on this machine (root, no Yama, no GPU), with AReaL 2.0's interpreter."""
    config = tmp_path / "config.yaml"
    python = AREAL2_PYTHON if AREAL2_PYTHON.exists() else Path(sys.executable)
    config.write_text(
        "experiment_name: doctor-test\ntrial_name: t0\n"
        f"cluster: {{n_nodes: 1, n_gpus_per_node: 0, fileroot: {tmp_path / 'root'}}}\n"
        f"launch: {{entrypoint: train.py, python: {python}}}\n"
    )
    areal_launch = Path(sys.executable).with_name("areal-launch")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    out = subprocess.run(
        [str(areal_launch), "doctor", str(config)], capture_output=True, text=True, timeout=120,
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {re.split(r"\s{2,}", line)[1]: line for line in out.stdout.splitlines()
            if line.split(" ")[0] in (PASS, WARN, FAIL)}  # fmt: skip
    expected = ["py-spy", "ptrace", "py-spy attach", "gpus", "flight recorder",
                "run dir filesystem", "fifos", "atomic rename", "areal", "notify",
                "slurm client", "ray client", "clock skew"]  # fmt: skip
    assert set(expected) <= set(rows), out.stdout
    if os.getuid() == 0 and not ptrace.YAMA.exists():
        assert "root, no Yama" in rows["ptrace"]
    assert rows["py-spy attach"].startswith(PASS) and rows["flight recorder"].startswith(PASS)
    assert rows["gpus"].startswith(WARN)  # no GPU here, none asked for
    assert "single node" in rows["clock skew"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]  # nothing left behind


@pytest.mark.slow
@pytest.mark.beside_slurm  # two AReaL imports (10-20 s each), where the CPU is idle
@pytest.mark.parametrize("release", ["1.0.4", "2.0.0"])
def test_every_hook_holds_on_the_real_areal_of_each_release(release: str, tmp_path: Path) -> None:
    """The example's AReaL config, checked with each release's interpreter: every function the
    dump, replay, quarantine and check-workflow wrap or call has the signature they expect."""
    python = Path(sys.executable) if release == "1.0.4" else AREAL2_PYTHON
    if not python.exists() or subprocess.run([str(python), "-c", "import areal"]).returncode:
        pytest.skip(f"AReaL {release} is not installed (bash scripts/setup.sh --areal)")
    config = REPO / "examples" / "areal" / "gsm8k_grpo.yaml"
    out = subprocess.run(
        [str(Path(sys.executable).with_name("areal-launch")), "doctor", str(config),
         f"cluster.fileroot={tmp_path}", f"+launch.python={python}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    rows = {re.split(r"\s{2,}", line)[1]: line for line in out.stdout.splitlines()
            if line.split(" ")[0] in (PASS, WARN, FAIL)}  # fmt: skip
    assert rows["areal"].startswith(PASS) and f"AReaL {release} (" in rows["areal"], out.stdout
    assert re.fullmatch(r"pass\s+areal hooks\s+all \d+ hooks match", rows["areal hooks"])
