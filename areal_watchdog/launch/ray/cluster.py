"""Which Ray cluster a launch runs on: an existing one's Jobs API, or one of this machine's own.

The own cluster is a head and ``launch.ray.nodes - 1`` more raylets on 127.0.0.1 (several raylets
share a host as Ray's own tests do: each its node name, its dashboard agent port). Each is a
``ray start --block`` child of the launcher: stopping it ends that node's daemons, and the
launcher's death (``kill -9`` too, through Ray's reaper) ends them all; nothing of another
cluster on the machine is touched (``ray stop`` would end every Ray process of the machine).

Ray makes its temp dir (sessions, sockets, logs) mode 0777 whatever it finds: it lives inside a
folder of the run's own, ``/tmp/areal-ray-<run id>``, made 0700 before the head starts and
removed once the cluster has stopped (``Raylets.stop``, or the guardian when the launcher died).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from areal_watchdog.common.atomic import open_append
from areal_watchdog.common.errors import UserError
from areal_watchdog.common.interprocess.parent import die_with_parent
from areal_watchdog.config.model import RaySection

LOOPBACK = "127.0.0.1"
RAY_AUTH_MODE = "RAY_AUTH_MODE"  # Ray's switch for its token authentication
START_TIMEOUT_S = 120.0  # one `ray start` on a loaded 2-core machine takes 5-15 s
START_ATTEMPTS = 3
OBJECT_STORE_BYTES = 200 * 1024**2  # the job moves no tensors through it: keep /dev/shm free
HEAD_NAME = "ray-head"
OUR_PREFIX = "AREAL_WATCHDOG_"
TEMP_ROOT = "/tmp/areal-ray-{run_id}"  # short: Ray's unix sockets live under it (107 bytes)


@dataclass(frozen=True)
class OwnCluster:
    """A cluster of this machine's own for one run; ports chosen when it is planned."""

    nodes: int
    cpus: int
    gpus: int
    gcs_port: int
    dashboard_port: int
    agent_ports: tuple[int, ...]  # the dashboard agent's port, one per raylet (52365 clashes)
    temp_dir: str  # Ray's, inside the run's private folder (TEMP_ROOT)

    @classmethod
    def plan(cls, ray: RaySection, nodes: int, run_id: str) -> OwnCluster:
        ports = free_ports(2 + nodes)
        return cls(
            nodes, ray.cpus_per_node, ray.gpus_per_node, ports[0], ports[1], tuple(ports[2:]),
            f"{TEMP_ROOT.format(run_id=run_id)}/ray",
        )  # fmt: skip

    @property
    def address(self) -> str:
        """The Jobs API's URL (the dashboard's)."""
        return f"http://{LOOPBACK}:{self.dashboard_port}"

    def node_names(self) -> list[str]:
        return [HEAD_NAME, *(f"ray-node{i}" for i in range(1, self.nodes))]

    def commands(self, python: str) -> list[list[str]]:
        """``ray start`` for the head, then for each other raylet."""
        ray = [python, "-m", "ray.scripts.scripts", "start", "--disable-usage-stats"]
        common = ["--node-ip-address", LOOPBACK, "--num-cpus", str(self.cpus)]
        common += ["--num-gpus", str(self.gpus), "--object-store-memory", str(OBJECT_STORE_BYTES)]
        names = self.node_names()
        head = [*ray, "--head", "--port", str(self.gcs_port), "--node-name", names[0], *common]
        head += ["--temp-dir", self.temp_dir, "--include-dashboard", "true"]
        head += ["--dashboard-host", LOOPBACK, "--dashboard-port", str(self.dashboard_port)]
        head += ["--dashboard-agent-listen-port", str(self.agent_ports[0])]
        others = [
            [*ray, "--address", f"{LOOPBACK}:{self.gcs_port}", "--node-name", name, *common,
             "--dashboard-agent-listen-port", str(port)]
            for name, port in zip(names[1:], self.agent_ports[1:], strict=True)
        ]  # fmt: skip
        return [head, *others]

    def start(self, python: str, logs: Path, say: Callable[[str], None]) -> Raylets:
        """Start every raylet, the head first, and return once all joined; a failure is one
        line, and what started is ended. A ``ray start`` that ended on its own (Ray gives a
        raylet 30 s to register with the GCS, and a loaded machine once took longer: CI) is
        started again, the whole cluster, up to ``START_ATTEMPTS`` times. Each is ``ray start
        --block`` in a process group of its own, killed if the launcher dies: its reaper then
        ends the whole group (a graceful stop leaves Ray's dashboard agents behind:
        ``Raylets.stop`` ends them). Each one's output goes to ``logs/ray_start_<node>.log``."""
        started = time.monotonic()
        for attempt in range(1, START_ATTEMPTS + 1):
            raylets, problem, again = self._start_once(python, logs)
            if problem is None:
                say(f"Ray cluster of {self.nodes} node(s) up ({time.monotonic() - started:.0f} s): "
                    f"{self.address}")  # fmt: skip
                return raylets
            raylets.stop()
            if not again or attempt == START_ATTEMPTS:
                raise UserError(f"Ray cluster: {problem}")
            say(f"Ray cluster: {problem}; starting it again ({attempt + 1} of {START_ATTEMPTS})")
        raise AssertionError("unreachable")

    def _start_once(self, python: str, logs: Path) -> tuple[Raylets, str | None, bool]:
        """One try: the raylets, what went wrong (None: all joined), and whether to try again
        (a ``ray start`` ended on its own)."""
        raylets = Raylets([], make_private(Path(self.temp_dir).parent))
        names = self.node_names()
        for argv, name in zip(self.commands(python), names, strict=True):
            with open_append(_log(logs, name)) as out:  # never a planted symlink
                proc = subprocess.Popen(
                    [*argv, "--block"], env=cluster_environment(), stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=lambda: die_with_parent(signal.SIGKILL),  # noqa: PLW1509
                )  # fmt: skip
            raylets.procs.append(proc)
            if name == HEAD_NAME and not _answers(self.address, proc):
                ended = _ended(name, _log(logs, name), proc)
                return raylets, ended or "the head's Jobs API never answered", bool(ended)
        joined = _joined(self.address, self.nodes, raylets.procs)
        if joined >= self.nodes:
            return raylets, None, False
        for name, proc in zip(names, raylets.procs, strict=True):
            if proc.poll() is not None:
                return raylets, _ended(name, _log(logs, name), proc), True
        waited = f"{joined} of {self.nodes} raylets joined within {START_TIMEOUT_S:g} s"
        return raylets, f"{waited} (their logs: {logs}/ray_start_*.log)", False


def _log(logs: Path, name: str) -> Path:
    """Where a node's ``ray start`` writes."""
    return logs / f"ray_start_{name}.log"


def _ended(name: str, log: Path, proc: subprocess.Popen) -> str:
    """``ray start of ray-node1 ended (LOG): <its last line>``; empty while it runs."""
    if proc.poll() is None:
        return ""
    last = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
    return f"ray start of {name} ended ({log}): {last[0][:300]}"


@dataclass
class Raylets:
    """The own cluster's ``ray start --block`` processes, one a node."""

    procs: list[subprocess.Popen]
    temp_root: Path  # removed once every node's daemons are gone

    @property
    def groups(self) -> list[int]:
        """Their process groups: every daemon of a node is in its raylet's starter's."""
        return [proc.pid for proc in self.procs]

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM (each ends its node's daemons), then SIGKILL to whatever of a node is left."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        remove_private(self.temp_root)


def make_private(path: Path) -> Path:
    """The run's own folder for Ray's temp dir, mode 0700; one left by a launch of the same run
    (a killed launcher, the guardian dead too) is taken back only if it is ours."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        if not _ours(path):
            raise UserError(f"{path} exists and is not a folder of yours: remove it") from None
        path.chmod(0o700)
    return path


def remove_private(path: Path) -> None:
    """Remove the run's folder for Ray's temp dir (never through a symlink, never another
    user's)."""
    if _ours(path):
        shutil.rmtree(path, ignore_errors=True)


def _ours(path: Path) -> bool:
    with contextlib.suppress(OSError):
        st = path.lstat()
        return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
    return False


def cluster_environment() -> dict[str, str]:
    """The launcher's environment without our marks: the cluster's daemons and the workers
    they start are no part of a run until the job's runtime_env makes them one (the marks
    would have the run's cleanup kill Ray's reaper before it reaps). Ray's token auth off, as
    said: Ray 2.60 turns it on for every ``ray start`` once any ``ray.init()`` on the machine
    wrote ``~/.ray/auth_token``, and the cluster would then refuse our own probes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(OUR_PREFIX)}
    return {**env, RAY_AUTH_MODE: "disabled"}


def _answers(address: str, proc: subprocess.Popen) -> bool:
    """The head's Jobs API answers before ``START_TIMEOUT_S`` and while ``ray start`` runs."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{address}/api/version", timeout=2) as answer,
        ):
            if answer.status == 200:
                return True
        time.sleep(0.5)
    return False


def _joined(address: str, nodes: int, procs: list[subprocess.Popen]) -> int:
    """How many raylets the head counts alive, once all of them are or ``START_TIMEOUT_S``
    passed (or a ``ray start`` ended): a job submitted before its nodes joined asks for a
    placement group the cluster cannot give yet (AReaL's Ray launcher waits 30 s for it)."""
    deadline, alive = time.monotonic() + START_TIMEOUT_S, 0
    while time.monotonic() < deadline and all(p.poll() is None for p in procs):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            with urllib.request.urlopen(f"{address}/api/v0/nodes", timeout=5) as answer:
                listed = json.loads(answer.read())["data"]["result"]["result"]
            alive = sum(node.get("state") == "ALIVE" for node in listed)
        if alive >= nodes:
            return alive
        time.sleep(0.5)
    return alive


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on loopback now (held open together, then released)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind((LOOPBACK, 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()
