"""Will the watchdog's AReaL hooks hold? The release ``launch.python`` has installed, and every
function the hooks wrap or call (``rank.areal_hooks.areal_trajectory``: the dump and the replay;
``rank.areal_hooks.areal_quarantine``; ``workflow_check.probe``; ``common.roles``: the modules whose
processes are told apart)
checked with ``inspect.signature`` in a child of that interpreter, where AReaL is imported
(10-20 s: AReaL pulls in torch and transformers)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from areal_watchdog.common.areal_version import installed_version, is_known, unknown_note
from areal_watchdog.common.roles import RPC_MODULES, SERVER_LAUNCHERS
from areal_watchdog.doctor.model import FAIL, PASS, WARN, Check
from areal_watchdog.rank.areal_hooks.areal_trajectory import (
    INIT_ROLLOUT_PARAMS,
    PREPARE_BATCH_PARAMS,
    TRAINER_MODULE,
)

TIMEOUT = 180.0
CONTROLLER = "areal.infra.controller.train_controller:TrainController"
ENGINE = "areal.api.engine_api:TrainEngine"
INF_ENGINE = "areal.infra.remote_inf_engine:RemoteInfEngine"
TRAIN_PARAMS = ("workflow", "eval_workflow", "workflow_kwargs")
DP_ATTRIBUTES = ("is_data_parallel_head", "data_parallel_rank", "data_parallel_world_size")
HOOK_FIX = (
    "use AReaL 1.0.x or 2.0.x, or an areal-watchdog that knows this release; until then "
    "trajectory dumps, replay and quarantine switch themselves off"
)


def _params(function: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(function).parameters)


def _starts(function: Any, expected: tuple[str, ...]) -> bool:
    return _params(function)[1 : 1 + len(expected)] == expected


def _trainer(load: Callable[[str], Any]) -> Any:
    return load(f"{TRAINER_MODULE}:PPOTrainer")


HOOKS: list[tuple[str, Callable[[Callable[[str], Any]], bool]]] = [
    (
        "PPOTrainer.train calls prepare_batch (dump)",
        lambda load: "prepare_batch" in _trainer(load).train.__code__.co_names,
    ),
    (
        f"PPOTrainer._init_rollout{INIT_ROLLOUT_PARAMS} (replay)",
        lambda load: _starts(_trainer(load)._init_rollout, INIT_ROLLOUT_PARAMS),
    ),
    (
        "PPOTrainer.__init__(train_dataset) (quarantine)",
        lambda load: "train_dataset" in _params(_trainer(load).__init__),
    ),
    (
        f"TrainController.prepare_batch{PREPARE_BATCH_PARAMS} (dump, replay)",
        lambda load: _starts(load(CONTROLLER).prepare_batch, PREPARE_BATCH_PARAMS),
    ),
    (
        f"TrainEngine.prepare_batch{PREPARE_BATCH_PARAMS} (SPMD dump, replay)",
        lambda load: _starts(load(ENGINE).prepare_batch, PREPARE_BATCH_PARAMS),
    ),
    (
        "TrainEngine data-parallel rank and size (SPMD dump)",
        lambda load: all(hasattr(load(ENGINE), a) for a in DP_ATTRIBUTES),
    ),
    (
        f"PPOTrainer.train{TRAIN_PARAMS} (check-workflow)",
        lambda load: _starts(_trainer(load).train, TRAIN_PARAMS),
    ),
    (
        "RemoteInfEngine._resolve_workflow(workflow, workflow_kwargs), rollout_batch(data, "
        "workflow) (check-workflow)",
        lambda load: (
            _starts(load(INF_ENGINE)._resolve_workflow, ("workflow", "workflow_kwargs"))
            and _starts(load(INF_ENGINE).rollout_batch, ("data", "workflow"))
        ),
    ),
    (
        "RTensor.localize (dump)",
        lambda load: callable(load("areal.infra.rpc.rtensor:RTensor").localize),
    ),
    (
        "current_platform, tensor_container_to (SPMD replay)",
        lambda load: (
            bool(load("areal.infra.platforms:current_platform"))
            and callable(load("areal.utils.data:tensor_container_to"))
        ),
    ),
]
MODULES = (*RPC_MODULES, *SERVER_LAUNCHERS)  # processes are told apart by these names


def import_load(name: str) -> Any:
    """``module:attribute`` imported."""
    module, _, attribute = name.partition(":")
    found = importlib.import_module(module)
    return getattr(found, attribute) if attribute else found


def hook_results(load: Callable[[str], Any], module_exists: Callable[[str], bool]) -> list[dict]:
    """Each hook: ``{"hook", "ok", "why"}``; ``why`` says what broke when it does not hold."""
    results = []
    for name, test in HOOKS:
        try:
            ok = bool(test(load))
            why = "" if ok else "differs"
        except Exception as exc:  # noqa: BLE001 - missing modules, attributes, signatures
            ok, why = False, f"{type(exc).__name__}: {exc}"[:160]
        results.append({"hook": name, "ok": ok, "why": why})
    for module in MODULES:
        ok = module_exists(module)
        results.append({"hook": f"module {module}", "ok": ok, "why": "" if ok else "missing"})
    return results


def check_areal(python: str, needed: bool) -> list[Check]:
    """The ``areal`` row (its release) and, when there is one, the ``areal hooks`` row."""
    version = installed_version(python)
    if version is None:
        if needed:
            return [
                Check(
                    "areal",
                    FAIL,
                    f"{python} has no areal package",
                    "install AReaL into launch.python's venv",
                )
            ]
        return [Check("areal", PASS, f"not installed in {python} (only AReaL jobs need it)")]
    note = unknown_note(version, "its hooks are unchecked")
    if not is_known(version):
        return [Check("areal", WARN, note or version, HOOK_FIX)]
    return [Check("areal", PASS, f"AReaL {version} ({python})"), hooks_check(python)]


def hooks_check(python: str) -> Check:
    try:
        out = subprocess.run(
            [python, "-m", __name__], capture_output=True, text=True, timeout=TIMEOUT
        )
        results = json.loads(out.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        return Check("areal hooks", WARN, f"importing AReaL took over {TIMEOUT:g} s", HOOK_FIX)
    except (OSError, IndexError, ValueError):
        return Check(
            "areal hooks",
            FAIL,
            "the probe could not import AReaL",
            f"run {python} -c 'import areal.trainer.rl_trainer' to see why",
        )
    return judge(results)


def judge(results: list[dict]) -> Check:
    broken = [r for r in results if not r.get("ok")]
    if not broken:
        return Check("areal hooks", PASS, f"all {len(results)} hooks match")
    named = "; ".join(f"{r['hook']}: {r['why']}" for r in broken[:3])
    more = f" (+{len(broken) - 3} more)" if len(broken) > 3 else ""
    return Check(
        "areal hooks", FAIL, f"{len(broken)} of {len(results)} differ: {named}{more}", HOOK_FIX
    )


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


if __name__ == "__main__":
    print(json.dumps(hook_results(import_load, _module_exists)))
    sys.exit(0)
