"""The metrics as Prometheus reads them: names and units by its conventions, every series
labelled by job and node, the job's only from the leader, the textfile and the endpoint record."""

from __future__ import annotations

import json
import re
import stat
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from areal_watchdog.metrics.exposition import SnapshotCollector, registry_for, render
from areal_watchdog.metrics.families import families, series_count
from areal_watchdog.metrics.http_endpoint import HttpEndpoint
from areal_watchdog.metrics.snapshot import JobMetrics, MetricsSnapshot, NodeMetrics
from areal_watchdog.metrics.textfile import remove_textfile, textfile_path, write_textfile
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.sidecar_files.metrics_endpoint import (
    MetricsEndpoint,
    read_endpoints,
    remove_endpoint,
    write_endpoint,
)

LABELS = {"experiment": "exp", "trial": "t1", "backend": "local", "job_id": "abc", "node": "n0"}


def leader_snapshot() -> MetricsSnapshot:
    job = JobMetrics(last_step=7, last_step_at=1000.0, last_progress_at=1000.0, threshold_s=5.0,
                     hard_limit_s=600.0, incidents={"straggler": 1, "crash": 0})  # fmt: skip
    job.looks["posted"] = 1
    job.deliveries[("ops-webhook", "delivered")] = 1
    for interval in (0.3, 0.3, 0.4, 12.0):
        job.step_intervals.observe(interval)
    node = NodeMetrics(leader=True, ranks_alive=4, gpus=8, gpus_working=6, cpu_s=1.5)
    node.poll_seconds.observe(0.0004)
    return MetricsSnapshot(LABELS, node, job)


def parsed(snapshot: MetricsSnapshot) -> dict[str, list]:
    collector = SnapshotCollector()
    collector.update(snapshot)
    text = render(registry_for(collector)).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_the_leader_exposes_the_job_and_every_series_names_job_and_node() -> None:
    found = parsed(leader_snapshot())
    assert found["areal_watchdog_last_step"][0].value == 7
    assert found["areal_watchdog_silence_seconds"][0].value > 1000  # counted to the scrape
    assert found["areal_watchdog_threshold_seconds"][0].value == 5
    looks = {s.labels["outcome"]: s.value for s in found["areal_watchdog_looks"]}
    assert looks == {"dismissed": 0, "written": 0, "posted": 1, "damage": 0, "warning": 0}
    buckets = {s.labels["le"]: s.value for s in found["areal_watchdog_step_interval_seconds"]
               if s.name.endswith("_bucket")}  # fmt: skip
    assert buckets["0.5"] == 3 and buckets["+Inf"] == 4
    for samples in found.values():
        for sample in samples:
            assert {k: sample.labels[k] for k in LABELS} == LABELS


def test_a_follower_exposes_its_node_only() -> None:
    snap = leader_snapshot()
    snap.job, snap.node.leader = None, False
    found = parsed(snap)
    assert "areal_watchdog_last_step" not in found and "areal_watchdog_leader" in found
    assert found["areal_watchdog_gpus_working"][0].value == 6


def test_names_follow_prometheus_units_and_a_node_makes_a_fixed_number_of_series() -> None:
    snap = leader_snapshot()
    names = [f.name for f in families(snap, 2000.0)]
    for f in families(snap, 2000.0):
        if f.kind == "counter":
            assert f.name.endswith("_total"), f.name
        assert not f.name.endswith(("_ms", "_minutes", "_bytes_total_total")), f.name
    assert "areal_watchdog_silence_seconds" in names
    snap.job = None
    assert series_count(families(snap, 2000.0)) == 19  # no per-rank label: any job size


def test_the_textfile_is_replaced_whole_readable_by_node_exporter_and_removed(
    tmp_path: Path,
) -> None:
    path = textfile_path(str(tmp_path), "run/1", "node a")
    assert path.name == "areal_watchdog_run_1_node_a.prom"
    write_textfile(path, b"areal_watchdog_leader 1\n")
    write_textfile(path, b"areal_watchdog_leader 0\n")
    assert path.read_bytes() == b"areal_watchdog_leader 0\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind
    remove_textfile(path)
    remove_textfile(path)  # twice: the job's end may come twice
    assert not path.exists()


def test_the_endpoint_listens_on_loopback_and_its_record_is_a_file_sd_target(
    tmp_path: Path,
) -> None:
    collector = SnapshotCollector()
    collector.update(leader_snapshot())
    endpoint = HttpEndpoint(registry_for(collector), "127.0.0.1", 0)
    try:
        assert endpoint.server.server_address[0] == "127.0.0.1"
        url = f"http://127.0.0.1:{endpoint.port}/metrics"
        assert b"areal_watchdog_last_step{" in urllib.request.urlopen(url, timeout=5).read()
        layout, shared = RunLayout(tmp_path / "run"), tmp_path / "file_sd"
        shared.mkdir()
        mine = MetricsEndpoint("run1", "n0", "127.0.0.1", endpoint.port)
        write_endpoint(layout, mine, str(shared))
        (record,) = read_endpoints(layout, "run1")
        assert record.address == f"127.0.0.1:{endpoint.port}"
        assert read_endpoints(layout, "another-run") == []
        (copy,) = shared.iterdir()
        assert json.loads(copy.read_text()) == [
            {"targets": [record.address], "labels": {"run_id": "run1", "areal_watchdog_node": "n0"}}
        ]
        remove_endpoint(layout, mine, str(shared))
        assert read_endpoints(layout, "run1") == [] and list(shared.iterdir()) == []
    finally:
        endpoint.close()


def test_the_shipped_rules_and_dashboard_read_only_metrics_we_export() -> None:
    """A renamed metric would leave an alert that never fires and a panel that stays empty."""
    repo = Path(__file__).resolve().parents[2] / "monitoring"
    snap = leader_snapshot()
    snap.node.status_written_at = 1000.0
    exported = {f.name for f in families(snap, 2000.0)}
    exported.add("areal_watchdog_node")  # the label every file_sd target carries
    exported |= {f"{n}_{s}" for n in exported for s in ("bucket", "sum", "count")}
    exported |= {n.removesuffix("_total") for n in exported}
    for name in ("areal-watchdog.rules.yml", "areal-watchdog-dashboard.json"):
        used = set(re.findall(r"areal_watchdog_[a-z_]+", (repo / name).read_text()))
        assert used and used <= exported, (name, used - exported)
