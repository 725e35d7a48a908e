"""The whole sidecar at scale, measured from outside: real sidecar processes, real stand-in
ranks, every path operation on the run directory counted in the kernel (bpftrace).

Up to 64 nodes are real (``fleet/spawner.py``: each a real sidecar, ``python -m
areal_watchdog.watch.sidecar --node``, and its stand-in ranks under our rank wrapper, which
register, print AReaL's step line on rank 0 and heartbeat every step); the other nodes of a
256- or 1,024-node job are the real ``Coordinator`` ticked in this process, publishing and
answering evidence requests as a sidecar's loop does (``bench_scale``; the answers from processes
of their own, and ahead of the real nodes on the CPU: see ``Simulated``). A bpftrace program on the
system calls that take a path (open, listing, stat, access, rename, mkdir, unlink, readlink)
prints every one that names the run directory, with its process and that process's parent; an
operation counts for the real sidecar it comes from (py-spy's for the sidecar that started it).
strace counted the same, but its stops cost more CPU than 64 sidecars on two cores have. The
states, one after the other:

- **start-up**: the first seconds, the ranks starting and registering;
- **steady**: every rank stepping;
- **a node lost**: a follower's sidecar and ranks killed; as long as the states that last as
  long as one likes, or until the leader names it if that is later;
- **a rank dead**: one rank of another follower killed (after the lost node: a failure reported
  first would leave the loss unreported, as the job is failing anyway);
- **a hang**: every rank stuck (in a sleep, as in a collective: it still answers signals);
  from then, as long as those states or until ``report.json`` if that is later (a faster report
  over a window that ended with it was a higher rate for the same operations);
- **after the end**: every rank returned, the sidecars lingering.

``AREAL_BENCH_NETFS=DIR`` puts the run directory on the network filesystem of ``scripts/netfs.sh
up DIR``, and gives every real node a client of its own (a mount namespace each); the simulated
nodes write and read on the server's disk, as their own clients would deliver it there.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path

from areal_watchdog.config.load import load_config
from areal_watchdog.launch.planning.job import job_environment, launch_files, prepare_run_dir
from areal_watchdog.launch.planning.plan import LaunchPlan
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.watch.cluster.coordination import Coordinator
from benchmarks.bench_scale import node_evidence

REPO = Path(__file__).resolve().parents[1]
SPAWNER = Path(__file__).resolve().parent / "fleet" / "spawner.py"
RANKS_PER_NODE = 2  # real ones a node (memory: 64 x 2 ranks + 64 sidecars on this machine)
POLL, NODE_TIMEOUT, STALL = 1.0, 10.0, 10.0
ANSWERING = 8  # threads ticking the simulated nodes
ANSWERERS, LOOK = 4, 0.1  # processes answering for them; seconds between their looks
# The system calls that name a path, and the argument that holds it.
PATH_CALLS = {
    "openat": "filename", "newfstatat": "filename", "statx": "filename",
    "faccessat2": "filename", "renameat2": "oldname", "rename": "oldname",
    "unlinkat": "pathname", "mkdirat": "pathname", "readlinkat": "pathname",
}  # fmt: skip


@dataclass
class Simulated:
    """The nodes beyond the real ones: the real Coordinator, ticked once a poll here, reading
    the leader's status as a real follower does (every poll from a poll before the stall
    threshold until it answered, else when its status is due). A request is answered at once
    by every simulated node, from processes of their own: their answers' latency is the real
    followers' to measure (through this process's threads, 960 answers took 2.7 s and the
    leader waited for them)."""

    layout: RunLayout
    coordinators: list[Coordinator]
    ranks: dict[str, dict[str, int]]  # each node's ranks, as a real status lists them
    requests: set[str] = field(default_factory=set)  # answered by every simulated node
    stop: threading.Event = field(default_factory=threading.Event)
    longest_tick: float = 0.0  # seconds: over node_timeout, the simulated nodes look lost

    def run(self) -> None:
        context = multiprocessing.get_context("spawn")
        _favoured()
        with (
            ThreadPoolExecutor(ANSWERING, initializer=_favoured) as pool,
            ProcessPoolExecutor(ANSWERERS, mp_context=context, initializer=_favoured) as answerers,
        ):
            threading.Thread(target=self._answer, args=(answerers,), daemon=True).start()
            while not self.stop.wait(POLL):
                started, closely = time.monotonic(), self._crossing()
                list(pool.map(self._tick, self.coordinators, repeat(closely)))
                self.longest_tick = max(self.longest_tick, time.monotonic() - started)

    def _leader(self) -> dict:
        return self.coordinators[0].read_status(self.coordinators[0].nodes[0]) or {}

    def _crossing(self) -> bool:
        """Whether a real follower would read the leader's status every poll now."""
        if not self.coordinators:
            return False
        leader = self._leader()
        progress_at = leader.get("last_progress_at")
        if not isinstance(progress_at, (int, float)):
            return False
        request = (leader.get("request") or {}).get("id")
        unanswered = request is None or request not in self.requests
        return time.time() >= progress_at + STALL - POLL and unanswered

    def _answer(self, answerers: ProcessPoolExecutor) -> None:
        """Every simulated node's answer to each new request, as soon as the leader asks."""
        # Started before they are needed, here: before the first tick, it waited for them (18
        # simulated nodes published late and were reported lost).
        list(answerers.map(time.sleep, [0] * ANSWERERS))
        nodes = [c.node for c in self.coordinators]
        shares = [nodes[i::ANSWERERS] for i in range(ANSWERERS)]
        run_id = self.coordinators[0].run_id if self.coordinators else ""
        while self.coordinators and not self.stop.wait(LOOK):
            request = (self._leader().get("request") or {}).get("id")
            if request and request not in self.requests:
                list(answerers.map(_answers, repeat(self.layout), repeat(run_id), shares,
                                   repeat(request)))  # fmt: skip
                self.requests.add(request)

    def _tick(self, coordinator: Coordinator, closely: bool) -> None:
        coordinator.refresh(closely=closely)
        coordinator.publish({"state": "watching", "ranks_alive": self.ranks[coordinator.node]})


def _favoured() -> None:
    """This thread ahead of the real nodes' (nice -10, as root): the simulated nodes stand for
    nodes with cores of their own, and while the 64 real ones started on two cores a tick of
    960 took 30 s and 227 of them were reported lost."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -10)


def _answers(layout: RunLayout, run_id: str, nodes: list[str], request_id: str) -> None:
    """These simulated nodes' answers to the request (in an answering process)."""
    for node in nodes:
        coordinator = Coordinator(layout, run_id, node, [node], NODE_TIMEOUT)
        coordinator.answer(request_id, node_evidence(node, RANKS_PER_NODE))


@dataclass
class Fleet:
    """The real processes, their path operations' counter, and the windows of each state (by
    the kernel's monotonic clock, which stamps the operations)."""

    proc: subprocess.Popen
    counter: subprocess.Popen
    spec: Path
    windows: dict[str, tuple[float, float]] = field(default_factory=dict)
    events: dict[str, tuple[dict, float]] = field(default_factory=dict)

    def command(self, line: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        self.proc.stdout.readline()  # "done ..."

    def window(self, state: str, seconds: float, started: float | None = None) -> None:
        """The state's window: ``seconds`` from ``started`` (now), or until now if later."""
        started = time.monotonic() if started is None else started
        time.sleep(max(0.0, started + seconds - time.monotonic()))
        self.windows[state] = (started, time.monotonic())

    def pids(self) -> dict:
        path = Path(f"{self.spec}.pids.json")
        deadline = time.monotonic() + 120
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        return json.loads(path.read_text())


TRACEFS = Path("/sys/kernel/tracing")


def _mount_tracefs() -> None:
    """bpftrace finds no ``syscalls:*`` tracepoint until tracefs is mounted, which a fresh
    machine may not have done (root only; a failure shows in bpftrace's own error)."""
    if not (TRACEFS / "events").is_dir() and os.geteuid() == 0:
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], capture_output=True)


def _counter(run_dir: Path, out: Path) -> subprocess.Popen:
    """bpftrace printing ``NSECS PID PARENT CALL PATH`` for each operation on ``run_dir``,
    attached before this returns."""
    _mount_tracefs()
    prefix = str(run_dir)
    program = "\n".join(
        f"tracepoint:syscalls:sys_enter_{call} "
        f'/strncmp(str(args->{arg}), "{prefix}", {len(prefix)}) == 0/ '
        f'{{ printf("%llu %d %d {call} %s\\n", nsecs, pid, curtask->real_parent->tgid, '
        f"str(args->{arg})); }}"
        for call, arg in PATH_CALLS.items()
    )
    env = {**os.environ, "BPFTRACE_STRLEN": "200"}
    proc = subprocess.Popen(["bpftrace", "-e", program], stdout=out.open("w"),
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    deadline = time.monotonic() + 60
    while "Attaching" not in out.read_text() and time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"bpftrace failed: {proc.stderr.read()[-500:]}")  # type: ignore[union-attr]
        time.sleep(0.2)
    return proc


def _incident(run_dir: Path, category: str, after: float, timeout: float) -> dict | None:
    """The first report of ``category`` written after ``after``, waited for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in sorted(run_dir.glob("incidents/*/report.json")):
            if path.stat().st_mtime > after:
                report = json.loads(path.read_text())
                if report.get("category") == category or category == "*":
                    return report
        time.sleep(0.25)
    return None


def _reports(run_dir: Path) -> list[dict]:
    """Every report written so far."""
    return [json.loads(p.read_text()) for p in sorted(run_dir.glob("incidents/*/report.json"))]


def _config(root: Path, n_nodes: int):
    return load_config(
        REPO / "examples" / "hang_demo" / "config.yaml",
        [f"cluster.fileroot={root}", "experiment_name=bench", "trial_name=fleet",
         f"cluster.n_nodes={n_nodes}", f"launch.nproc_per_node={RANKS_PER_NODE}",
         f"watchdog.poll_interval={POLL}", f"+watchdog.node_timeout={NODE_TIMEOUT}",
         f"watchdog.stall_timeout={STALL}", "watchdog.on_hang=report",
         "+watchdog.confirm_after=0"],
    )  # fmt: skip


def _start(
    root: Path, n_nodes: int, real: int, traces: Path, netfs: str | None
) -> tuple[Fleet, Simulated, Path]:
    """The run directory as a Slurm launch writes it, the simulated nodes, the real ones (with
    ``netfs``, each with a client of its own)."""
    config = _config(root, n_nodes)
    layout, run_id = RunLayout(config.run_dir.resolve()), "fleet" + os.urandom(3).hex()
    nodes = [f"node{i:04d}" for i in range(n_nodes)]
    info = LaunchInfo.for_config(
        config, run_id, "slurm", layout.run_dir, n_nodes * RANKS_PER_NODE, nodes
    )
    files = launch_files(config, info, watchdog=True)
    prepare_run_dir(LaunchPlan("slurm", run_id, str(layout.run_dir), files, []))
    rank0_log = layout.torchrun_logs_dir / nodes[0] / "bench" / "attempt_0" / "0" / "stdout.log"
    rank0_log.parent.mkdir(parents=True)
    env = job_environment(config, layout, run_id, None, watchdog=True)
    spec = traces / "spec.json"
    spec.write_text(json.dumps({
        "python": sys.executable, "run_dir": str(layout.run_dir), "logs": str(traces),
        "nodes": nodes[:real], "ranks_per_node": RANKS_PER_NODE,
        "world_size": n_nodes * RANKS_PER_NODE, "env": env, "rank0_log": str(rank0_log),
        "mount": ["bash", str(REPO / "scripts" / "netfs.sh"), "client", netfs] if netfs else None,
        "mount_point": str(Path(netfs, "mnt")) if netfs else None,
    }))  # fmt: skip
    served = _served(layout, netfs)
    simulated = Simulated(
        served,
        [Coordinator(served, run_id, n, list(nodes), NODE_TIMEOUT) for n in nodes[real:]],
        {n: {str(i * RANKS_PER_NODE + r): 0 for r in range(RANKS_PER_NODE)}
         for i, n in enumerate(nodes)},
    )  # fmt: skip
    threading.Thread(target=simulated.run, daemon=True).start()
    counter = _counter(layout.run_dir, traces / "ops.txt")
    proc = subprocess.Popen(
        [sys.executable, str(SPAWNER), str(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    return Fleet(proc, counter, spec), simulated, layout.run_dir


def _served(layout: RunLayout, netfs: str | None) -> RunLayout:
    """Where the simulated nodes write: on the server's disk, as a node's own client delivers
    it there (through the benchmark's one client, a tick of 960 nodes took up to 32 s, over
    ``node_timeout``; 29 s with four SSH connections)."""
    if not netfs:
        return layout
    mount, export = Path(netfs, "mnt").resolve(), Path(netfs, "export").resolve()
    return RunLayout(export / layout.run_dir.relative_to(mount))


def _count(ops: Path, roots: dict[int, str]) -> dict[str, list[float]]:
    """The operations' times by real sidecar: its own, and its children's (py-spy)."""
    stamps: dict[str, list[float]] = defaultdict(list)
    with ops.open(errors="replace") as lines:
        for line in lines:
            fields = line.split(" ", 4)
            if len(fields) < 5 or not fields[0].isdigit():
                continue
            node = roots.get(int(fields[1])) or roots.get(int(fields[2]))
            if node is not None:
                stamps[node].append(int(fields[0]) / 1e9)
    return stamps


def _rates(
    stamps: dict[str, list[float]], window: tuple[float, float], nodes: list[str]
) -> dict[str, float]:
    start, end = window
    return {n: sum(start <= t < end for t in stamps.get(n, [])) / (end - start) for n in nodes}


def measure(n_nodes: int, real: int, windows: float) -> list[StateCost]:
    """One job of ``n_nodes`` (``real`` of them real) through every state, ``windows`` seconds
    for those that last as long as one likes."""
    netfs = os.environ.get("AREAL_BENCH_NETFS")
    root = Path(netfs, "mnt") if netfs else Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(dir=root) as tmp, tempfile.TemporaryDirectory() as traces:
        fleet, simulated, run_dir = _start(Path(tmp), n_nodes, real, Path(traces), netfs)
        try:
            pids, offset = fleet.pids(), time.time() - time.monotonic()
            notes = _states(fleet, run_dir, windows)
            if simulated.coordinators:
                notes["steady"] += f"simulated nodes' longest tick {simulated.longest_tick:.1f} s"
        finally:
            simulated.stop.set()
            for proc in (fleet.proc, fleet.counter):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        roots = {int(pid): node for node, pid in pids["sidecars"].items()}
        stamps = _count(Path(traces) / "ops.txt", roots)
        notes.update(_event_notes(fleet, Path(traces) / "ops.txt", offset))
        if os.environ.get("AREAL_BENCH_KEEP"):  # operations, windows and logs, to read them
            kept = Path(os.environ["AREAL_BENCH_KEEP"])
            subprocess.run(["cp", "-r", traces, str(kept / f"traces-{n_nodes}")], check=True)
            logs = run_dir / "watchdog" / "logs"  # the sidecars' (an answer's time, ...)
            subprocess.run(["cp", "-r", str(logs), str(kept / f"logs-{n_nodes}")], check=True)
            (kept / f"windows-{n_nodes}.json").write_text(json.dumps([fleet.windows, pids]))
    return _costs(n_nodes, sorted(roots.values()), fleet.windows, stamps, notes)


def _states(fleet: Fleet, run_dir: Path, windows: float) -> dict[str, str]:
    """Take the job through every state; what the leader did about the lost node and the hang
    (``fleet.events``: each report and when, by the wall clock, its clock started)."""
    fleet.window("start-up", windows)
    fleet.window("steady", 2 * windows)
    early = sorted({n for r in _reports(run_dir) for n in r.get("culprit_nodes", [])})
    started, killed = time.monotonic(), time.time()
    fleet.command(f"kill-node node{2:04d}")
    lost = _incident(run_dir, "node_lost", killed, 6 * NODE_TIMEOUT)
    fleet.window("a node lost", windows, started)  # the node stays lost after its report
    fleet.command(f"kill-rank node{1:04d}")  # after: a dead rank's report would silence the loss
    fleet.window("a rank dead", windows)
    started, stuck = time.monotonic(), time.time()
    fleet.command("stick")
    hang = _incident(run_dir, "*", stuck + 1, 8 * STALL)
    fleet.window("a hang", windows, started)  # and the job hangs on
    fleet.command("end")
    fleet.window("after the end", windows)
    fleet.command("quit")
    fleet.proc.wait(timeout=60)
    if lost:
        fleet.events["a node lost"] = (lost, killed)
    if hang:
        fleet.events["a hang"] = (hang, _stamp(hang["last_progress_at"]) + STALL)
    lost_early = f"{len(early)} reported lost before any was ({early[0]}...); " if early else ""
    return {"steady": lost_early}


def _event_notes(fleet: Fleet, ops: Path, offset: float) -> dict[str, str]:
    """How long each report took from its clock's start to its ``report.json``'s rename, as the
    kernel stamped it (a file's time on the network filesystem is whole seconds)."""
    written = _renamed(ops, {r["incident_id"] for r, _ in fleet.events.values()})
    notes = {"a node lost": "not named", "a hang": "no report"}
    for state, (report, since) in fleet.events.items():
        took = written.get(report["incident_id"], float("nan")) + offset - since
        what = "named in" if state == "a node lost" else "stall->report"
        notes[state] = f"{what} {took:.2f} s ({report['category']})"
    return notes


def _renamed(ops: Path, incidents: set[str]) -> dict[str, float]:
    """When each incident's ``report.json`` took its name (monotonic seconds)."""
    written = {}
    with ops.open(errors="replace") as lines:
        for line in lines:
            fields = line.split(" ", 4)
            if len(fields) == 5 and fields[3].startswith("rename") and ".report.json." in line:
                incident = Path(fields[4].strip()).parent.name
                if incident in incidents:
                    written[incident] = int(fields[0]) / 1e9
    return written


@dataclass(frozen=True)
class StateCost:
    """One state's path operations a second: a follower's (mean, max), the leader's; a note."""

    state: str
    follower_mean: float
    follower_max: float
    leader: float
    leader_per_node_poll: float
    note: str = ""


def _costs(
    n_nodes: int, real: list[str], windows: dict[str, tuple[float, float]],
    stamps: dict[str, list[float]], notes: dict[str, str],
) -> list[StateCost]:  # fmt: skip
    """Each state's rates: a follower's (a follower killed or lost counts until then), the
    leader's (the first node)."""
    leader = real[0]
    costs = []
    for state, window in windows.items():
        rates = _rates(stamps, window, real)
        followers = [v for node, v in rates.items() if node != leader]
        costs.append(StateCost(
            state, sum(followers) / max(1, len(followers)), max(followers, default=0.0),
            rates.get(leader, 0.0), rates.get(leader, 0.0) * POLL / n_nodes,
            notes.get(state, ""),
        ))  # fmt: skip
    return costs


def _stamp(value: object) -> float:
    from datetime import datetime

    return datetime.fromisoformat(str(value)).timestamp()


def run_sidecar_benchmarks(quick: bool = False) -> list:
    """The table: per job size and state, a follower's and the leader's path operations."""
    sizes = (16,) if quick else (64, 256, 1024)
    rows = []
    for n_nodes in sizes:
        real = min(4 if quick else 64, n_nodes)
        for cost in measure(n_nodes, real, 10.0 if quick else 20.0):
            rows.append((
                f"{n_nodes} ({real} real)", cost.state,
                f"{cost.follower_mean:.2f} / {cost.follower_max:.2f}",
                f"{cost.leader:.1f} ({cost.leader_per_node_poll:.2f})", cost.note,
            ))  # fmt: skip
    header = ("nodes", "state", "follower ops/s mean / max", "leader ops/s (per node per poll)",
              "")  # fmt: skip
    title = (
        f"The whole sidecar, real processes ({RANKS_PER_NODE} stand-in ranks a real node), path "
        f"operations on the run directory counted in the kernel (poll {POLL:g} s, node_timeout "
        f"{NODE_TIMEOUT:g} s, stall {STALL:g} s; goals: a follower <= 2/s in every state, the "
        "leader <= 1 per node per poll, stall->report <= 5 s)"
    )
    return [(title, rows, header)]
