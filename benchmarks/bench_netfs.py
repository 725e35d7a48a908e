"""The network filesystem's caches against the sidecars' protocol, measured: how late one node
sees what another wrote, with the caches off (0 s), as NFS's shortest attribute timeout (3 s)
and as its directory minimum (30 s, ``acdirmin``).

Two real nodes (``fleet/netfs_probe.py``), each in a mount namespace of its own with its own
client of ``scripts/netfs.sh`` (sshfs against an sshd on 127.0.0.1): the leader publishes its
status every second through the real ``Coordinator`` and asks for evidence every 2.7 s, the
follower reads the leader's status every 50 ms the way a follower does (``refresh``) and
answers each request at once. Measured on the machine's one clock:

- **stale reads**: a status read that began after a newer one had been renamed into place,
  and how long after that rename;
- **request seen**: from the leader's request written to the follower reading it;
- **answer seen**: from the follower's answer written to the leader's ``collect`` returning it
  (a listing of the request's folder, then a read; ``collect`` looks after 50, 150, 350 ms...).

Root (namespaces, FUSE) and Debian's ``openssh-server`` and ``sshfs``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from areal_watchdog.rundir.layout import RunLayout

REPO = Path(__file__).resolve().parents[1]
NETFS = REPO / "scripts" / "netfs.sh"
PROBE = Path(__file__).resolve().parent / "fleet" / "netfs_probe.py"
CACHES = (0, 3, 30)  # seconds: off; NFS's acregmin; its acdirmin


def measure(cache: int, seconds: float) -> dict[str, list[float]]:
    """One run of the two nodes on a filesystem cached ``cache`` seconds: the delays."""
    with tempfile.TemporaryDirectory() as base:
        netfs, logs = Path(base, "nfs"), Path(base)
        subprocess.run(["bash", str(NETFS), "up", str(netfs), str(cache)], check=True,
                       capture_output=True)  # fmt: skip
        procs = []
        try:
            run = netfs / "mnt" / "run"
            layout = RunLayout(run)
            for directory in layout.live_dirs():  # as a launch makes them, before any node looks
                directory.mkdir(parents=True, exist_ok=True)
            layout.launch_file.write_text("{}")
            procs = [
                _node(role, netfs, run, logs / role, seconds) for role in ("leader", "follower")
            ]
            for proc in procs:
                proc.wait(timeout=seconds + 60)
            events = [json.loads(line) for role in ("leader", "follower")
                      for line in (logs / role).read_text().splitlines()]  # fmt: skip
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            subprocess.run(["bash", str(NETFS), "down", str(netfs)], check=False)
    return _delays(events)


def _node(role: str, netfs: Path, run: Path, log: Path, seconds: float) -> subprocess.Popen:
    """One node: a mount namespace, its own client over the run root, the probe."""
    script = (
        f'bash {NETFS} client {netfs} && "$0" "$@"; code=$?; '
        f"umount -l {netfs / 'mnt'} 2>/dev/null; exit $code"
    )
    argv = [sys.executable, str(PROBE), role, str(run), str(log), str(seconds)]
    return subprocess.Popen(["unshare", "--mount", "--propagation", "private", "bash", "-c",
                             script, *argv])  # fmt: skip


def _delays(events: list[dict]) -> dict[str, list[float]]:
    """Each stale read's age (from the newer status's rename), each request's and answer's
    delay, and every read (for the share that was stale)."""
    published = sorted((e["published"], e["at"]) for e in events if "published" in e)
    reads = [(e["read"], e["began"]) for e in events if "read" in e and e["read"] is not None]
    stale = []
    for seq, began in reads:  # a newer status renamed into place before the read began
        newer = [t for s, t in published if s > seq and t < began]
        if newer:
            stale.append(began - min(newer))
    asked = {e["asked"]: e["at"] for e in events if "asked" in e}
    saw = {e["saw"]: e for e in events if "saw" in e}
    collected = {e["collected"]: e["at"] for e in events if e.get("answered")}
    return {
        "reads": [at for _, at in reads],
        "stale": stale,
        "request": [saw[r]["at"] - t for r, t in asked.items() if r in saw],
        "answer": [t - saw[r]["answered_at"] for r, t in collected.items() if r in saw],
    }


def _spread(values: list[float]) -> str:
    if not values:
        return "none"
    return f"{sum(values) / len(values):.2f} / {max(values):.2f} s ({len(values)})"


def run_netfs_benchmarks(quick: bool = False) -> list:
    """The table: per cache timeout, stale reads and the request's and answer's delays."""
    rows = []
    for cache in CACHES:
        delays = measure(cache, 15.0 if quick else 40.0)
        share = len(delays["stale"]) / max(1, len(delays["reads"]))
        rows.append((
            f"{cache} s", f"{share:.1%}, longest {max(delays['stale'], default=0.0):.2f} s",
            _spread(delays["request"]), _spread(delays["answer"]),
        ))  # fmt: skip
    header = ("caches", "status reads stale (share, longest)", "request seen after, mean / max",
              "answer seen after, mean / max")  # fmt: skip
    title = (
        "The network filesystem stand-in (sshfs), two real nodes with a client each: how late a "
        "follower sees the leader's status and request, and the leader the follower's answer "
        "(the follower looks every 50 ms; a real one every poll)"
    )
    return [(title, rows, header)]
