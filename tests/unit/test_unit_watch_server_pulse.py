"""Do the job's inference servers generate? The pulse against the SGLang stand-in on 127.0.0.1
(its real ``/metrics`` counters): silent, then generating, then silent; a server that is
gone counts as not generating, and one that answered once and now refuses connections is named
(the leader's ``server_refused``); ``status`` says it in its answer, summed over the nodes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from areal_watchdog.evidence.rollout_side.servers import probe
from areal_watchdog.report.run_status import status_lines
from areal_watchdog.watch.processes.server_pulse import ServerPulse

STANDIN = (
    Path(__file__).resolve().parents[2] / "examples" / "inference_server" / "sglang_standin.py"
)


def generate(address: str, tokens: int) -> None:
    body = json.dumps({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": tokens}})
    request = urllib.request.Request(f"http://{address}/generate", body.encode())
    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10).read()


def test_a_servers_counter_that_moves_is_generating_and_one_that_stands_is_not() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, str(STANDIN), "--port", str(port)])
    address = f"127.0.0.1:{port}"
    try:
        for _ in range(200):
            if probe(address, 0.5)["state"] == "up":
                break
            time.sleep(0.05)
        pulse = ServerPulse()
        pulse.sample([address])
        assert pulse.summary() is None  # one probe: no rate yet
        assert pulse.refused() == {}
        generate(address, 32)
        pulse.sample([address])
        moving = pulse.summary()
        assert moving is not None and (moving["of"], moving["generating"]) == (1, 1)
        assert moving["tokens_per_s"] > 0
        pulse.sample([address])
        assert pulse.summary() == {"of": 1, "generating": 0, "tokens_per_s": 0.0}
    finally:
        server.kill()
        server.wait()
    pulse.sample([address])  # gone: refused
    assert pulse.summary() == {"of": 1, "generating": 0, "tokens_per_s": 0.0}
    assert list(pulse.refused()) == [address]  # it answered once: a fact for the leader
    assert ServerPulse().refused() == {}  # never up (still starting): no fact
    never = ServerPulse()
    never.sample([address])
    assert never.refused() == {}


def test_status_says_how_many_servers_generate_over_every_node(tmp_path: Path) -> None:
    status = tmp_path / "watchdog" / "status"
    status.mkdir(parents=True)
    pace = {"step": 7, "since": 90.0, "threshold": 30.0, "learned": True, "intervals": 6,
            "median": 10.0, "p99": 12.0, "longest": 12.0}  # fmt: skip
    nodes = {"a": {"of": 2, "generating": 1, "tokens_per_s": 400.0},
             "b": {"of": 1, "generating": 1, "tokens_per_s": 35.5}}  # fmt: skip
    for node, servers in nodes.items():
        record = {"node": node, "leader": "a", "state": "watching", "pace": pace,
                  "servers": servers}  # fmt: skip
        (status / f"{node}.json").write_text(json.dumps(record))
    (status / "c.json").write_text(json.dumps({"node": "c", "servers": {"of": "x"}}))
    lines = status_lines(tmp_path, 100.0)
    assert lines[0].endswith("; 2 of 3 inference servers generating")
    assert "  servers     2 of 3 generating, 435.5 tokens/s" in lines
