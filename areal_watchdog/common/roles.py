"""Which part of a job a process is, read from its command line and environment alone.

AReaL 1.0 gives no other handle: a single-controller worker's ``RANK`` arrives later over HTTP
(``/set_env``), so it is not in the process's environment, but its command line always says
``-m areal.infra.rpc.rpc_server --role actor --worker-index 0``. The rank-side hook and the
sidecar both call ``identify``, so both agree on every process's role without talking.

Roles: ``controller`` (the training script AReaL's scheduler runs in), the worker roles AReaL's
scheduler names (``actor``, ``critic``, ``ref``, ``rollout``, ``eval-rollout``, ...),
``inference_server``, ``inference_launcher`` (SPMD's server wrapper), ``data_service``, AReaL
2.0's ``guard`` (the gateway that forks a role's workers) and its ``areal.v2`` services by name
(``gateway``, ``router``, ``data_proxy``, ...),
``rank`` (a torchrun rank), ``torchrun`` (its agent). ``None``: not a part we watch (a shell, a
``multiprocessing`` helper, a tool a workflow runs).
"""

from __future__ import annotations

from dataclasses import dataclass

RPC_MODULES = ("areal.infra.rpc.rpc_server",)
GUARD_MODULE = "areal.infra.rpc.guard"  # AReaL 2.0: the gateway that forks a role's workers
V2_SERVICES = "areal.v2."  # AReaL 2.0's services: gateway, router, data_proxy, guard, ...
SERVER_MODULES = (
    "areal.experimental.inference_service.sglang.launch_server",  # AReaL 1.0
    "areal.v2.inference_service.sglang.launch_server",  # AReaL 2.0
    "sglang.launch_server",
    "areal.engine.vllm_ext.areal_vllm_server",
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.cli.main",  # `vllm serve` as a module
)
VLLM_SCRIPT = "vllm"  # `vllm serve ...`, the console script
SERVER_LAUNCHERS = ("areal.infra.launcher.sglang_server", "areal.infra.launcher.vllm_server")
DATA_SERVICE = "areal.infra.data_service."
TORCHRUN = ("torch.distributed.run", "torchrun")
RANK_WRAPPERS = ("areal_watchdog.rank.main",)
SIDECAR_MODULE = "areal_watchdog.watch.sidecar"  # ours: never a part of the job, nor a helper
OUR_LAUNCHERS = "areal_watchdog.launch."  # ours too (the Ray job's driver): never a part
HELPERS = ("multiprocessing", "joblib", "concurrent.futures")


@dataclass(frozen=True)
class Identity:
    """A process's place in the job."""

    role: str
    index: int | None = None  # AReaL's worker index within the role
    address: str | None = None  # host:port, for inference servers

    def label(self) -> str:
        """``rollout 0``, ``inference_server 127.0.0.1:30000``, ``controller``."""
        if self.address:
            return f"{self.role} {self.address}"
        return self.role if self.index is None else f"{self.role} {self.index}"


def identify(argv: list[str], env: dict[str, str], controller_config: str) -> Identity | None:
    """The role of the process running ``argv`` with ``env``; ``controller_config`` is the job
    config path the launcher hands the training script (only the controller holds it without
    a role of its own)."""
    if not argv or any(h in a for a in argv[:3] for h in HELPERS):
        return None
    python = _is_python(argv[0])
    module = _module(argv) if python else None
    if module and module.startswith(OUR_LAUNCHERS):
        return None
    if module in RPC_MODULES:
        index = _flag(argv, "--worker-index") or env.get("SLURM_PROCID")
        return Identity(_flag(argv, "--role") or "worker", _int(index))
    if module == GUARD_MODULE:
        return Identity("guard", _int(_flag(argv, "--worker-index")))
    if module in SERVER_MODULES or _vllm_serve(argv):
        return Identity("inference_server", address=_address(argv))
    if module in SERVER_LAUNCHERS:
        return Identity("inference_launcher")
    if module and module.startswith(V2_SERVICES) and module not in SERVER_MODULES:
        return Identity(_service(module), _int(_flag(argv, "--worker-index")))
    if module and module.startswith(DATA_SERVICE):
        return Identity("data_service", _int(env.get("SLURM_PROCID")))
    if module in TORCHRUN or any(a.endswith("/torchrun") for a in argv[:2]):
        return Identity("torchrun")
    if "RANK" in env and (module in RANK_WRAPPERS or "LOCAL_RANK" in env):
        return Identity("rank", _int(env.get("RANK")))
    if python and controller_config and controller_config in argv:
        return Identity("controller")
    return None


def _service(module: str) -> str:
    """``areal.v2.inference_service.gateway.__main__`` -> ``gateway``."""
    parts = [p for p in module.split(".") if p not in ("__main__", "app", "main")]
    return parts[-1]


def _vllm_serve(argv: list[str]) -> bool:
    return argv[0].rsplit("/", 1)[-1] == VLLM_SCRIPT and "serve" in argv[1:3]


def _is_python(exe: str) -> bool:
    name = exe.rsplit("/", 1)[-1]
    return name.startswith("python") or name == "torchrun"


def _module(argv: list[str]) -> str | None:
    """The module run with ``-m`` (``python -u -m x`` too)."""
    for i, arg in enumerate(argv[1:], start=1):
        if arg == "-m" and i + 1 < len(argv):
            return argv[i + 1]
        if not arg.startswith("-"):
            return None
    return None


def _flag(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _address(argv: list[str]) -> str | None:
    host, port = _flag(argv, "--host"), _flag(argv, "--port")
    if not port:
        return None
    host = host or "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
