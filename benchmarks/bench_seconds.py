"""Seconds, not minutes, at the shipped defaults: from a hang's last step to the webhook that
posts it, for every hang pattern of the torchrun demo placed both in the first step intervals
(step 3, inside the learned threshold's warm-up) and after it (step 10), and no post at all for
jobs that are healthy or in a silent phase every real job has: one rank's checkpoint in fsync'd
chunks, every rank's evaluation on the CPU, a slow first step, a large file read by every rank,
an upload to a slow HTTP endpoint, an evaluation on the GPU (the recorded H200 samples).

Each row is a real 4-rank gloo job (``examples/hang_demo``, 0.3 s steps) with the watchdog's
shipped thresholds (``stall_timeout: auto``, ``poll_interval: 1``, confirmations and hard limit
automatic) posting to a signed webhook on 127.0.0.1; "posted" is when the receiver got the
report, "last step" the step line's own timestamp.

A node kill is timed on the real ``Coordinator`` at the shipped ``node_timeout`` and
``poll_interval``: 16 nodes publishing from threads, the leader polling, nodes killed one by one
at random moments of their status period (a real run's report follows its naming in 0.2 s: the
Ray test's ``gather_s``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import psutil

from areal_watchdog.config.model import WatchdogSection
from areal_watchdog.evidence.kernel_readings.counters import read_counters
from areal_watchdog.evidence.kernel_readings.sockets import tcp_bytes
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.watch.cluster.coordination import Coordinator
from benchmarks.bench_watchdog import DEMO, STEP_STAMP, launch
from testkit.launcher import Launcher
from testkit.receiver import Receiver
from testkit.reports import suspected_looks
from testkit.slow_endpoint import SlowEndpoint
from testkit.vllm_server import VLLM_PYTHON, Saturation, make_vllm_model, running_vllm

REPO = Path(__file__).resolve().parents[1]
ROLLOUT_DEMO = REPO / "examples" / "rollout_hangs" / "config.yaml"
H200 = REPO / "tests" / "data" / "gpu" / "h200" / "nvml_samples.jsonl"
POLL_INTERVAL = 1.0  # the shipped one: the sidecar senses once a poll while silent
HANG_STEP = 10  # past the learned threshold's warm-up (3 step intervals)
EARLY_STEP = 3  # inside it: the threshold is still the 60 s floor
PHASE_S = 30  # how long each silent healthy phase lasts
QUIET_STEPS = 5  # a saturated server's job learns its threshold on these (warm-up included)
WATCHDOG = [  # the shipped watchdog, posting to the benchmark's receiver
    "watchdog.stall_timeout=auto",
    f"watchdog.poll_interval={POLL_INTERVAL:g}",
    "watchdog.startup_timeout=1800",
    "watchdog.on_hang=cancel",
    "+watchdog.notify=[{type: webhook, url_env: BENCH_HOOK_URL, secret_env: BENCH_HOOK_SECRET}]",
]
SHIPPED = [
    *WATCHDOG,
    "launch.nproc_per_node=4",
    f"demo.steps={HANG_STEP + 6}",
]
PATTERNS = (
    "collective_mismatch",
    "collective_stuck",
    "cleanup_deadlock",
    "straggler",
    "dataloader_stall",
    "p2p_mismatch",
    "crash",
    "quiet_exit",
    "child_blocked",
)
Rows = list[tuple[str, ...]]


def last_step_at(output: str) -> float | None:
    """The timestamp of rank 0's last step line."""
    stamps = [m.group(1) for m in STEP_STAMP.finditer(output)]
    if not stamps:
        return None
    return datetime.strptime(stamps[-1], "%Y%m%d-%H:%M:%S.%f").timestamp()


def run_one(root: Path, receiver: Receiver, trial: str, overrides: list[str]) -> dict:
    """One job: what was posted, when, and how long after the last step."""
    before = len(receiver.requests)
    output, _ = launch(root, trial, [*SHIPPED, *overrides])
    posted = receiver.requests[before:]
    last = last_step_at(output)
    first = posted[0].json() if posted else None
    return {
        "posts": len(posted),
        "category": first["verdict"]["category"] if first else "-",
        "culprits": first["verdict"]["culprit_ranks"] if first else [],
        "seconds": posted[0].wall - last if posted and last else None,
    }


def gpu_recording(folder: Path) -> Path:
    """The H200's samples under 4096 x 4096 matmuls (98-99 % at ~600 W), from the start: a
    GPU at work for the whole job, matched to the ranks by index."""
    frames = [json.loads(line) for line in H200.read_text().splitlines()]
    busy = [f for f in frames if f["t"] >= 15.0]
    path = folder / "gpu-working.jsonl"
    path.write_text("".join(json.dumps({**f, "t": f["t"] - 15.0}) + "\n" for f in busy))
    return path


def run_seconds_benchmarks(quick: bool = False) -> Iterator[tuple[str, Rows, tuple[str, ...]]]:
    receiver = Receiver("bench-secret")
    os.environ["BENCH_HOOK_URL"], os.environ["BENCH_HOOK_SECRET"] = receiver.url(), "bench-secret"
    repeats = 1 if quick else 3
    with tempfile.TemporaryDirectory(prefix="areal-bench-seconds-") as tmp:
        root = Path(tmp)
        rows: Rows = []
        every: list[float] = []
        for pattern in PATTERNS:
            for step in (EARLY_STEP, HANG_STEP):
                seconds, seen = [], set()
                for i in range(repeats):
                    hang = [f"demo.hang={pattern}", f"demo.hang_step={step}", "demo.hang_rank=2"]
                    result = run_one(root, receiver, f"{pattern}{step}x{i}", hang)
                    seen.add(f"{result['category']} {result['culprits']}")
                    if result["seconds"] is not None:
                        seconds.append(result["seconds"])
                every += seconds
                rows.append(_latency_row(f"{pattern} (step {step})", seconds, repeats, seen))
        rows.append(_latency_row("all patterns", every, repeats * len(PATTERNS) * 2, set()))
        header = ("hang", "posted", "median s", "max s", "verdict (culprits)")
        yield (
            "Last step to posted report, shipped defaults (target: max <= 15 s, median <= 10 s)",
            rows,
            header,
        )
        endpoint = SlowEndpoint()
        healthy = healthy_jobs(root, endpoint.url())
        quiet: Rows = []
        calm = 1 if quick else 5  # each healthy phase, 5 runs
        for name, overrides in healthy.items():
            posts = [run_one(root, receiver, f"ok{len(quiet)}{i}", overrides) for i in range(calm)]
            quiet.append((name, f"{sum(p['posts'] for p in posts)} of {calm} runs", "0"))
        endpoint.close()
        quiet.append(saturated_server(root, receiver, repeats))
        yield (
            "False positives at the shipped defaults (posted reports)",
            quiet,
            ("job", "posted", "target"),
        )
        kills = 4 if quick else 12
        named = node_kill_seconds(root / "kills", kills)
        yield (
            "Node killed to named lost, shipped node_timeout and poll_interval (target <= 15 s)",
            [_latency_row(f"{kills} nodes killed", named, kills, set())[:4]],
            ("event", "named", "median s", "max s"),
        )
        yield (
            "Each process's own counters, per poll and per look (8 real processes a node)",
            counters_cost(),
            ("read", "median ms", "max ms"),
        )
        yield (
            "The sensor between looks, per poll (4 real gloo ranks, 3 in one all_reduce)",
            sensor_cost(root, 10 if quick else 30),
            ("", "median ms", "max ms", "rank CPU ms a sensing"),
        )
    receiver.close()


def healthy_jobs(root: Path, upload_url: str) -> dict[str, list[str]]:
    """The jobs that must never be posted, each with its silent phase after the warm-up."""
    at, phase = f"@{HANG_STEP}", ["demo.hang=none", f"demo.phase_time={PHASE_S}"]
    return {
        "healthy": ["demo.hang=none"],
        "slow phase (all ranks 20 s idle in their own code)": [
            "demo.hang=none", f"demo.slow_step={HANG_STEP}", "demo.slow_time=20",
        ],
        f"rank 0's silent checkpoint (160 MB in fsync'd 1 MB chunks, {PHASE_S} s)": [
            *phase, f"demo.phases=checkpoint{at}", "demo.phase_mb=160",
        ],
        f"every rank's CPU evaluation ({PHASE_S} s, forward passes and a scoring loop)": [
            *phase, f"demo.phases=cpu_eval{at}",
        ],
        "a slow first step (every rank 20 s in its own code)": [
            "demo.hang=none", "demo.slow_step=1", "demo.slow_time=20",
        ],
        f"a 200 MB file read by every rank ({PHASE_S} s)": [
            *phase, f"demo.phases=read{at}", "demo.phase_mb=200",
        ],
        "rank 0's upload to a slow HTTP endpoint (8 MB at 320 KB/s)": [
            *phase, f"demo.phases=upload{at}", "demo.phase_mb=8", f"demo.phase_url={upload_url}",
        ],
        **tree_jobs(),
        "silent GPU evaluation (20 s, H200 samples at ~600 W)": [
            "demo.hang=none", f"demo.slow_step={HANG_STEP}", "demo.slow_time=20",
            "+watchdog.gpu.backend=recorded", f"+watchdog.gpu.recording={gpu_recording(root)}",
        ],
    }  # fmt: skip


def tree_jobs() -> dict[str, list[str]]:
    """The healthy jobs whose work is in a rank's children (``evidence/process_tree.py``)."""
    at, phase = f"@{HANG_STEP}", ["demo.hang=none", f"demo.phase_time={PHASE_S}"]
    return {
        f"rank 0's checkpoint copied by a child process (160 MB fsync'd, {PHASE_S} s)": [
            *phase, f"demo.phases=child_checkpoint{at}", "demo.phase_mb=160",
        ],
        f"every rank's DataLoader worker busy on one long document ({PHASE_S} s of CPU)": [
            *phase, f"demo.phases=loader_work{at}", "demo.eval_ranks=-1",
        ],
    }  # fmt: skip


def saturated_server(root: Path, receiver: Receiver, repeats: int) -> tuple[str, ...]:
    """A 2-rank RL job on a real vLLM (``examples/rollout_hangs``, 4 rollouts a step) that other
    clients fill once the threshold has learned its quiet steps: 64 completions of 240 tokens
    always queued, so each later step waits far past the learned threshold while the server
    generates. Posts counted as for the other jobs."""
    name = f"saturated server (real vLLM, 64 clients queued from step {QUIET_STEPS + 1})"
    if not VLLM_PYTHON.exists():
        return (name, "not run: no .venv-vllm (bash scripts/setup.sh --vllm)", "0")
    model = make_vllm_model(root / "vllm-model")
    posts, busy = 0, 0
    with running_vllm(model) as address:
        demo = [f"demo.server_port={address.rsplit(':', 1)[1]}", "demo.server=vllm",
                "demo.start_server=false", f"demo.vllm_model={model}", "demo.hang=none",
                f"demo.steps={QUIET_STEPS + 4}", "demo.max_concurrent_rollouts=4"]  # fmt: skip
        for i in range(repeats):
            before = len(receiver.requests)
            proc, run_dir = Launcher(root).start(
                [*WATCHDOG, *demo], trial=f"saturated{i}", config=ROLLOUT_DEMO
            )
            for line in proc.stdout or ():
                if f"Train step {QUIET_STEPS}/" in line:
                    break
            with Saturation(address, model, 64, tokens=240):
                proc.communicate(timeout=900)
            posts += len(receiver.requests) - before
            looks = suspected_looks(run_dir)
            busy += sum("busy, not hung" in look["summary"] for look in looks)
    return (name, f"{posts} of {repeats} runs ({busy} looks: busy, not hung)", "0")


def counters_cost(ranks: int = 8, polls: int = 200) -> Rows:
    """What reading the counters costs the sidecar: every poll reads each rank's CPU time,
    I/O and context switches (``read_counters``); a look also lists their TCP sockets once
    (``tcp_bytes``: one ``ss``)."""
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
             for _ in range(ranks)]  # fmt: skip
    try:
        handles = [psutil.Process(p.pid) for p in procs]
        poll, look = [], []
        for _ in range(polls):
            started = time.perf_counter()
            for handle in handles:
                read_counters(handle, time.time())
            poll.append(time.perf_counter() - started)
        for _ in range(polls // 10):
            started = time.perf_counter()
            tcp_bytes({p.pid for p in procs})
            look.append(time.perf_counter() - started)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return [
        (f"a poll: {ranks} processes' counters", *_ms(poll)),
        ("a look: their TCP bytes (one ss)", *_ms(look)),
    ]


def _ms(seconds: list[float]) -> tuple[str, str]:
    return f"{statistics.median(seconds) * 1e3:.2f}", f"{max(seconds) * 1e3:.2f}"


def sensor_cost(root: Path, seconds: int) -> Rows:
    """What one sensing costs (the sidecar senses each poll while the job is silent): its wall
    time as the sidecar published it, and the ranks' CPU a sensing (their listener's dump of
    the entries in flight), on a job whose ranks 0-2 wait in one all_reduce while rank 3 writes
    a checkpoint for 600 s (1 MB/s: moving data, so the sensor reads on and never looks; a
    rank 3 that only slept would be a hang, posted)."""
    trial = "sensor"
    cmd = [sys.executable, "-m", "areal_watchdog.cli", "--watchdog", "local", str(DEMO),
           f"cluster.fileroot={root}", f"trial_name={trial}", *SHIPPED, "demo.hang=none",
           "watchdog.stall_timeout=600", f"demo.phases=checkpoint@{HANG_STEP}",
           "demo.phase_rank=3", "demo.phase_time=600", "demo.phase_mb=600"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=REPO,
                            start_new_session=True)  # fmt: skip
    try:
        reading, pids = _readings(root, trial, lambda r: len(r.get("ranks", {})) == 4, proc)
        cpu = _ranks_cpu(pids)
        before, at = sum(cpu()), time.monotonic()
        walls = []
        while time.monotonic() - at < seconds:
            last = reading["at"]
            reading, _ = _readings(root, trial, lambda r, last=last: r["at"] != last, proc)
            walls.append(reading["took"])
        sensings = (time.monotonic() - at) / POLL_INTERVAL  # one a poll, each published or not
        per_rank = (sum(cpu()) - before) / sensings / 4
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    return [(f"{len(walls)} sensings", f"{statistics.median(walls) * 1e3:.0f}",
             f"{max(walls) * 1e3:.0f}", f"{per_rank * 1e3:.2f}")]  # fmt: skip


def _readings(
    root: Path, trial: str, wanted: Callable[[dict], bool], launcher: subprocess.Popen
) -> tuple[dict, list[int]]:
    """The node's next published sensing that is ``wanted``, and the ranks' pids."""
    for _ in range(3000):
        if launcher.poll() is not None:
            raise RuntimeError(f"the launcher ended (exit {launcher.returncode})")
        for path in root.glob(f"*/{trial}/watchdog/status/*.json"):
            with contextlib.suppress(OSError, ValueError):
                status = json.loads(path.read_text())
                reading = status.get("in_flight")
                if reading and wanted(reading):
                    return reading, [int(p) for p in status["ranks_alive"].values()]
        time.sleep(0.1)
    raise RuntimeError("the sidecar never published the sensing")


def _ranks_cpu(pids: list[int]) -> Callable[[], list[float]]:
    handles = [psutil.Process(pid) for pid in pids]
    return lambda: [sum(h.cpu_times()[:2]) for h in handles]


def node_kill_seconds(folder: Path, kills: int, nodes: int = 16) -> list[float]:
    """Seconds from each node's kill to the leader naming it lost."""
    wd = WatchdogSection()
    layout = RunLayout(folder / "run")
    layout.watch_dir.mkdir(parents=True)
    layout.launch_file.write_text("{}")
    names = [f"node{i:02d}" for i in range(nodes)]
    fleet = [Coordinator(layout, "r1", n, list(names), wd.node_timeout) for n in names]
    killed: dict[str, float] = {}
    stop = threading.Event()

    def publish(node: Coordinator) -> None:  # a sidecar's status, until its node is killed
        while not stop.is_set() and node.node not in killed:
            node.publish({"state": "watching"})
            time.sleep(0.05)

    threads = [threading.Thread(target=publish, args=(c,), daemon=True) for c in fleet[1:]]
    for thread in threads:
        thread.start()
    leader, named, rng = fleet[0], {}, random.Random(7)
    victims = iter(names[1 : kills + 1])
    next_kill = time.monotonic() + wd.node_timeout
    while len(named) < kills:
        now = time.monotonic()
        if now >= next_kill and (victim := next(victims, None)):
            killed[victim] = now
            next_kill = now + rng.uniform(0.5, 2.0) * leader.interval
        leader.refresh()
        for node in leader.lost_nodes(finished=set()):
            named.setdefault(node, time.monotonic() - killed.get(node, now))
        time.sleep(wd.poll_interval)
    stop.set()
    return [named[n] for n in killed]


def _latency_row(name: str, seconds: list[float], runs: int, seen: set[str]) -> tuple[str, ...]:
    if not seconds:
        return (name, f"0 of {runs}", "-", "-", ", ".join(sorted(seen)))
    return (
        name,
        f"{len(seconds)} of {runs}",
        f"{statistics.median(seconds):.1f}",
        f"{max(seconds):.1f}",
        ", ".join(sorted(seen)),
    )
