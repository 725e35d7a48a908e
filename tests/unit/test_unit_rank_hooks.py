"""How the watchdog reaches processes no wrapper of ours starts: the ``sitecustomize`` hook
(``rank.sitehook.sitecustomize`` -> ``rank.hook``), code run right after a module's import
(``rank.areal_hooks.after_import``) and the resumed run's quarantine it applies
(``rank.areal_hooks.areal_quarantine``), a Ray worker's role (``rank.ray.ray_worker``) and the Ray
controller (``rank.ray.ray_controller``). Hooks that arm a process run in a child the test ends; Ray
is a fake module."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from areal_watchdog.common.roles import Identity
from areal_watchdog.rank import hook
from areal_watchdog.rank.areal_hooks import after_import as after_import_module
from areal_watchdog.rank.areal_hooks import areal_quarantine
from areal_watchdog.rank.areal_hooks.after_import import after_import
from areal_watchdog.rank.ray import ray_controller, ray_worker
from areal_watchdog.rank.sitehook import DIRECTORY as SITEHOOK
from areal_watchdog.rundir.layout import ENV_RUN_ID, ENV_WATCH_DIR, RunLayout
from areal_watchdog.trajectory.quarantine import ENV_QUARANTINE, QuarantinedRow, add_rows

REPO = Path(__file__).resolve().parents[2]
HUNG_PROMPT = "Prove that the tool call to the sandbox never returns for this input."


@pytest.fixture
def fresh_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A module of this test's own, importable and not yet imported; forgotten afterwards."""
    name = f"unit_fake_trainer_{os.getpid()}_{id(tmp_path)}"
    monkeypatch.syspath_prepend(str(tmp_path))
    finders = list(sys.meta_path)
    try:
        yield name
    finally:
        sys.modules.pop(name, None)
        after_import_module._waiting.pop(name, None)
        sys.meta_path[:] = finders


def test_after_import_runs_once_the_module_executed_and_at_once_when_it_had(
    tmp_path: Path, fresh_module: str
) -> None:
    (tmp_path / f"{fresh_module}.py").write_text("VALUE = 41\n")
    seen: list[int] = []
    after_import(fresh_module, lambda m: seen.append(m.VALUE))
    assert seen == []  # not imported yet
    module = importlib.import_module(fresh_module)
    assert seen == [41]  # after the module's code ran, before anyone used it
    assert not any(type(f).__name__ == "_AfterImport" for f in sys.meta_path)
    module.VALUE = 42
    after_import(fresh_module, lambda m: seen.append(m.VALUE))
    assert seen == [41, 42]


TRAINER = """
class PPOTrainer:
    def __init__(self, config, train_dataset=None, valid_dataset=None):
        self.train_dataset = train_dataset
"""


def test_a_resumed_run_trains_without_its_quarantined_rows(
    tmp_path: Path, fresh_module: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    quarantine = tmp_path / "quarantine.json"
    add_rows(quarantine, [QuarantinedRow(4, 1, "inc-1", f"<user>{HUNG_PROMPT}</user>")])
    (tmp_path / f"{fresh_module}.py").write_text(TRAINER)
    monkeypatch.setattr(areal_quarantine, "TRAINER_MODULE", fresh_module)
    monkeypatch.setenv(ENV_QUARANTINE, str(quarantine))
    monkeypatch.setenv("RANK", "0")
    areal_quarantine.install()
    module = importlib.import_module(fresh_module)
    rows = [{"prompt": "What is two plus two, written in words?"}, {"prompt": HUNG_PROMPT}]
    trainer = module.PPOTrainer({"lr": 1}, train_dataset=rows)
    assert trainer.train_dataset == rows[:1]
    trainer = module.PPOTrainer({"lr": 1}, rows)  # passed by position: filtered all the same
    assert trainer.train_dataset == rows[:1]
    assert "1 row(s) of the training data left out" in capsys.readouterr().err
    applied = json.loads((tmp_path / "quarantine_applied.json").read_text())
    assert (applied["left_out"], applied["rows"]) == (1, 2)


def test_a_quarantine_matching_too_many_rows_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"prompt": HUNG_PROMPT, "id": i} for i in range(6)]  # one text many rows share
    kept = areal_quarantine.without_rows(rows, [HUNG_PROMPT], tmp_path / "quarantine.json")
    assert kept is rows
    assert "refused" in capsys.readouterr().err
    unfilterable = areal_quarantine.without_rows((1, 2), [HUNG_PROMPT], tmp_path / "q.json")
    assert unfilterable == (1, 2) and "cannot leave rows out of a tuple" in capsys.readouterr().err


def _package(root: Path, dotted: str, body: str) -> None:
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        folder = root.joinpath(*parts[:i])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").touch()
    root.joinpath(*parts[:-1], f"{parts[-1]}.py").write_text(body)


def _python(tmp_path: Path, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    other_site = tmp_path / "other_site"  # a sitecustomize that ours shadows
    other_site.mkdir(exist_ok=True)
    (other_site / "sitecustomize.py").write_text("print('site chained', flush=True)\n")
    path = os.pathsep.join([SITEHOOK, str(tmp_path / "fake"), str(REPO), str(other_site)])
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AREAL_WATCHDOG")},
           "PYTHONPATH": path, **env}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, *argv], env=env, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip


def test_the_site_hook_arms_an_areal_worker_and_records_how_it_ended(tmp_path: Path) -> None:
    _package(
        tmp_path / "fake", "areal.infra.rpc.rpc_server", "raise RuntimeError('weights lost')\n"
    )
    layout = RunLayout(tmp_path / "run")
    env = {ENV_RUN_ID: "r1", ENV_WATCH_DIR: str(layout.watch_dir)}
    argv = ["-m", "areal.infra.rpc.rpc_server", "--role", "rollout", "--worker-index", "2"]
    proc = _python(tmp_path, argv, env)
    try:
        out, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 1 and "weights lost" in err
    assert out == "site chained\n"  # the shadowed sitecustomize still ran
    record = json.loads(layout.process_exit_record(proc.pid).read_text())
    assert (record["kind"], record["exc_type"], record["message"]) == (
        "exception", "RuntimeError", "weights lost"
    )  # fmt: skip
    assert layout.process_stack_file(proc.pid).exists()  # the cooperative dump was armed
    assert layout.tasks_trigger(proc.pid).exists()  # and the asyncio task listener


def test_the_site_hook_leaves_a_process_outside_a_watched_job_alone(tmp_path: Path) -> None:
    proc = _python(tmp_path, ["-c", "print('ran')"], {})
    try:
        out, _ = proc.communicate(timeout=10)
    finally:
        proc.kill()
        proc.wait()
    assert (proc.returncode, out) == (0, "site chained\nran\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other_site"]


def test_the_hook_does_nothing_without_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_RUN_ID, raising=False)
    before = set(threading.enumerate())
    assert hook.install() is None
    assert set(threading.enumerate()) == before


def test_the_site_hook_module_imports_safely_outside_a_run_and_chains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Imported here as Python imports it at start-up: nothing armed, the shadowed one run."""
    monkeypatch.delenv(ENV_RUN_ID, raising=False)
    other_site = tmp_path / "other_site"
    other_site.mkdir()
    marker = tmp_path / "chained"
    (other_site / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.setattr(sys, "path", [SITEHOOK, str(REPO), str(other_site)])
    name = "areal_watchdog.rank.sitehook.sitecustomize"
    before = set(threading.enumerate())
    try:
        importlib.import_module(name)
    finally:
        sys.modules.pop(name, None)
    assert marker.exists() and set(threading.enumerate()) == before


def test_a_ray_worker_is_armed_once_ray_names_its_areal_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ray_worker.is_ray_worker(
        ["python", "/ray/_private/workers/default_worker.py"], {"RAY_RAYLET_PID": "1"}
    )
    assert not ray_worker.is_ray_worker(["python", "default_worker.py"], {})
    assert ray_worker.identity_of("actor/0") == Identity("actor", 0)
    assert ray_worker.identity_of("eval-rollout/12") == Identity("eval-rollout", 12)
    assert ray_worker.identity_of("my_actor") is None and ray_worker.identity_of(None) is None
    context = SimpleNamespace(get_actor_name=lambda: "actor/3")
    fake_ray = ModuleType("ray")
    fake_ray.get_runtime_context = lambda: context  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    armed: list[Identity] = []
    record = tmp_path / "procs" / "123.role.json"
    before = set(threading.enumerate())
    ray_worker.watch_for_role(record, "r1", armed.append)
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=2.0)
        assert not thread.is_alive()
    assert armed == [Identity("actor", 3)]
    written = json.loads(record.read_text())
    assert (written["run_id"], written["role"], written["index"], written["pid"]) == (
        "r1", "actor", 3, os.getpid()
    )  # fmt: skip


def test_the_ray_controller_connects_then_runs_the_script_as_main(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    fake_ray = ModuleType("ray")
    fake_ray.init = lambda: calls.append("init")  # type: ignore[attr-defined]
    fake_ray.is_initialized = lambda: bool(calls)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = tmp_path / "seen.json"
    script = tmp_path / "train.py"
    script.write_text(
        "import json, sys, ray\n"
        f"json.dump([__name__, sys.argv, ray.is_initialized()], open({str(out)!r}, 'w'))\n"
    )
    ray_controller.main([str(script), "--config", "c.yaml"])
    assert calls == ["init"]
    assert json.loads(out.read_text()) == ["__main__", [str(script), "--config", "c.yaml"], True]
    with pytest.raises(SystemExit, match="usage"):
        ray_controller.main([])
