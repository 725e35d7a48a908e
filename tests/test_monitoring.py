"""A real Prometheus scrapes a real hung torchrun job through both ways out: the sidecar's HTTP
endpoint (found through its file_sd target) and a real node_exporter's textfile collector. The
values are read through Prometheus' query API, and the shipped alert rule fires there."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from areal_watchdog.common.interprocess.ports import free_port
from conftest import REPO
from testkit.launcher import Launcher
from testkit.reports import read_reports

RULES = REPO / "monitoring" / "areal-watchdog.rules.yml"
DASHBOARD = REPO / "monitoring" / "areal-watchdog-dashboard.json"
INSTALL = "apt-get install prometheus prometheus-node-exporter (Debian's packages)"
PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
HANG = ["demo.hang=straggler", "demo.hang_step=6", "demo.steps=30", "launch.nproc_per_node=4",
        "watchdog.stall_timeout=auto", "watchdog.poll_interval=1", "watchdog.on_hang=report",
        "watchdog.startup_timeout=120", "+watchdog.metrics.http=true"]  # fmt: skip
ENDPOINT, TEXTFILE = '{job="areal-watchdog",trial="prom"}', '{job="node",trial="prom"}'

pytestmark = pytest.mark.skipif(
    not (PROMETHEUS and PROMTOOL and NODE_EXPORTER), reason=f"no Prometheus here: {INSTALL}"
)


class Prometheus:
    """A real Prometheus on 127.0.0.1, read through its HTTP API."""

    def __init__(self, folder: Path, file_sd: Path, node_exporter: str) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        config = folder / "prometheus.yml"
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {"job_name": "areal-watchdog",
                 "file_sd_configs": [{"files": [str(file_sd / "*.json")]}]},
                {"job_name": "node", "static_configs": [{"targets": [node_exporter]}]},
            ],
        }))  # fmt: skip
        self.proc = _start([PROMETHEUS, f"--config.file={config}",
                            f"--web.listen-address={self.address}",
                            f"--storage.tsdb.path={folder / 'tsdb'}"])  # fmt: skip
        _until(lambda: _get(f"http://{self.address}/-/ready"), 60, "Prometheus ready")

    def value(self, expr: str) -> float | None:
        query = urllib.parse.urlencode({"query": expr})
        result = json.loads(_get(f"http://{self.address}/api/v1/query?{query}"))["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def error(self, expr: str) -> str | None:
        """Prometheus' own word on an expression: None where it evaluates."""
        query = urllib.parse.urlencode({"query": expr})
        try:
            urllib.request.urlopen(f"http://{self.address}/api/v1/query?{query}", timeout=5)
        except urllib.error.HTTPError as exc:
            return exc.read().decode()
        return None

    def firing(self, name: str) -> dict | None:
        alerts = json.loads(_get(f"http://{self.address}/api/v1/alerts"))["data"]["alerts"]
        return next((a for a in alerts if a["labels"]["alertname"] == name
                     and a["state"] == "firing"), None)  # fmt: skip


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[Prometheus, Path, Path]]:
    """Prometheus and node_exporter (only its textfile collector), and their two folders."""
    file_sd, textfiles = tmp_path / "file_sd", tmp_path / "textfile"
    file_sd.mkdir(), textfiles.mkdir()
    exporter = f"127.0.0.1:{free_port()}"
    node = _start([NODE_EXPORTER, f"--web.listen-address={exporter}",
                   "--collector.disable-defaults", "--collector.textfile",
                   f"--collector.textfile.directory={textfiles}"])  # fmt: skip
    prometheus = None
    try:
        prometheus = Prometheus(tmp_path, file_sd, exporter)
        yield prometheus, file_sd, textfiles
    finally:
        for proc in (node, prometheus.proc if prometheus else None):
            _stop(proc)


def test_promtool_passes_the_shipped_rules() -> None:
    out = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 5 rules found" in out.stdout


@pytest.mark.slow
@pytest.mark.beside_slurm
def test_a_real_hang_seen_through_prometheus_both_ways(launcher: Launcher, watched: Any) -> None:
    prometheus, file_sd, textfiles = watched
    ways = [
        f"+watchdog.metrics.file_sd_dir={file_sd}",
        f"+watchdog.metrics.textfile_dir={textfiles}",
    ]
    proc, run_dir = launcher.start([*HANG, *ways], trial="prom")
    _until(lambda: prometheus.value(f"areal_watchdog_last_step{ENDPOINT}") == 5, 120, "step 5")
    (target,) = json.loads(next(file_sd.glob("*.json")).read_text())
    assert target["targets"][0].startswith("127.0.0.1:")
    # The silence grows while the job hangs: Prometheus' own samples, seconds apart.
    first = prometheus.value(f"areal_watchdog_silence_seconds{ENDPOINT}")
    time.sleep(2.5)
    assert prometheus.value(f"areal_watchdog_silence_seconds{ENDPOINT}") > first + 1.5
    # The look and the incident, and the shipped rule firing within a scrape of the incident.
    posted = 'areal_watchdog_incidents_total{job="areal-watchdog",kind="straggler"}'
    _until(lambda: prometheus.value(posted) == 1, 90, "the incident in Prometheus")
    (report,) = _until(lambda: read_reports(run_dir), 30, "the report on disk")
    incident_at = (run_dir / "incidents" / report["incident_id"] / "report.json").stat().st_mtime
    alert = _until(lambda: prometheus.firing("AReaLWatchdogIncident"), 30, "the incident alert")
    assert (alert["labels"]["kind"], alert["labels"]["trial"]) == ("straggler", "prom")
    active_at = datetime.fromisoformat(alert["activeAt"][:26].rstrip("Z") + "+00:00").timestamp()
    assert active_at - incident_at < 2.5, (alert["activeAt"], incident_at)
    assert prometheus.value(f"sum(areal_watchdog_looks_total{ENDPOINT})") >= 1
    assert prometheus.firing("AReaLWatchdogSilentPastThreshold")
    # The textfile way gives the same values, through node_exporter, once both hold the same
    # poll (the poll histogram's count): each way is scraped at its own moment.
    _until(lambda: same_poll(prometheus), 30, "both ways at the same poll")
    # Every panel of the shipped dashboard is a query this Prometheus evaluates, with data.
    for expr in dashboard_queries():
        assert prometheus.error(expr) is None, expr
    # The job's end takes both back: no file_sd target, no textfile.
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=90)
    assert list(file_sd.iterdir()) == [] and list(textfiles.iterdir()) == []
    assert list((run_dir / "watchdog" / "metrics").iterdir()) == []


POLLS = "areal_watchdog_poll_duration_seconds_count"
COMPARED = ("areal_watchdog_last_step", "areal_watchdog_threshold_seconds",
            "areal_watchdog_looks_total")  # fmt: skip


def same_poll(prometheus: Prometheus) -> bool:
    """Whether the textfile and the endpoint, as last scraped, hold the same poll; if so, they
    must hold the same values."""
    polls = [prometheus.value(f"sum({POLLS}{way})") for way in (TEXTFILE, ENDPOINT)]
    values = {way: [prometheus.value(f"sum({n}{way})") for n in COMPARED]
              for way in (TEXTFILE, ENDPOINT)}  # fmt: skip
    again = [prometheus.value(f"sum({POLLS}{way})") for way in (TEXTFILE, ENDPOINT)]
    if None in polls or polls[0] != polls[1] or again != polls:
        return False  # another poll was scraped meanwhile: read again
    assert values[TEXTFILE] == values[ENDPOINT], (polls, values)
    return True


def dashboard_queries() -> list[str]:
    """Every panel's query, its variables set to 'all'."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    return [e.replace("$experiment", ".*").replace("$trial", ".*") for e in exprs]


def _get(url: str) -> bytes | None:
    try:
        return urllib.request.urlopen(url, timeout=5).read()
    except OSError:
        return None


def _until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    pytest.fail(f"{what}: not within {timeout:g} s")


def _start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
