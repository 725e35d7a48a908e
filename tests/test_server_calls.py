"""The rollout side's sensor between looks: a server that keeps a call waiting that the other
servers answered, read from the kernel's TCP sockets of a real client and two real HTTP servers
(one answers, one never does), and the rule on recorded readings."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from areal_watchdog.diagnose.rollout_rules.server_calls import AWAITED_MIN_S, awaited_server
from areal_watchdog.evidence.rollout_side.server_calls import (
    ServerCall,
    parse_server_calls,
    read_server_calls,
)
from areal_watchdog.watch.processes.server_call_sensor import ServerCallSensor

SS_SAMPLE = (  # ``ss -tinpH dst ...`` here: pid 7543 sent 2.0 s ago, heard nothing for 3.0 s
    'ESTAB 0      0      127.0.0.1:56258 127.0.0.1:50457 users:(("python3",pid=7543,fd=4))\n'
    "\t bbr wscale:10,10 rto:208 bytes_sent:8 bytes_acked:9 bytes_received:6 lastsnd:2020 "
    "lastrcv:3024 lastack:1976 delivered:3 app_limited\n"
    "ESTAB 0      0      [::ffff:127.0.0.1]:56260 [::ffff:127.0.0.1]:50458 "
    'users:(("python3",pid=7543,fd=5))\n'
    "\t cubic bytes_received:90 lastsnd:2100 lastrcv:1800 lastack:1800\n"
)


def test_a_socket_that_sent_after_it_last_heard_awaits_an_answer() -> None:
    calls = parse_server_calls(SS_SAMPLE, {7543}, ["127.0.0.1:50457", "127.0.0.1:50458"])
    assert calls == [
        ServerCall(7543, "127.0.0.1:50457", 2.02, 3.024),
        ServerCall(7543, "127.0.0.1:50458", 2.1, 1.8),
    ]
    assert calls[0].awaiting and not calls[1].awaiting
    assert calls[1].answered_in == pytest.approx(0.3)
    assert parse_server_calls(SS_SAMPLE, {1}, ["127.0.0.1:50457"]) == []


def test_one_server_past_five_times_what_the_others_took_in_the_same_round_is_awaited() -> None:
    answered = ServerCall(8, "b:1", 6.1, 5.8)  # another rollout worker's update, 0.3 s
    held = ServerCall(9, "a:1", 6.0, None)
    found = awaited_server([held, answered], {})
    assert (found.server, found.answered_by, found.limit) == ("a:1", ("b:1",), AWAITED_MIN_S)
    assert "a:1 has not answered pid 9's call for 6 s; b:1 answered the same call in 0.3 s" in (
        found.phrase()
    )
    early = ServerCall(9, "a:1", 3.0, None)
    assert awaited_server([early, ServerCall(8, "b:1", 3.1, 2.8)], {}) is None  # under 5 s
    slow_peer = ServerCall(8, "b:1", 9.5, 7.5)  # the other took 2 s: limit 10 s
    assert awaited_server([ServerCall(9, "a:1", 9.0, None), slow_peer], {}) is None
    lone = awaited_server([held, ServerCall(8, "b:1", 30.0, 29.0)], {})  # an older round
    assert lone.answered_by == () and "no other server keeps the job waiting" in lone.phrase()


def test_a_server_busy_for_the_process_or_every_server_slow_together_is_no_finding() -> None:
    held = ServerCall(9, "a:1", 12.0, None)
    streaming = ServerCall(9, "a:1", 20.0, 0.5)  # the same server answers another connection
    assert awaited_server([held, streaming], {}) is None
    also_slow = ServerCall(8, "b:1", 11.0, None)  # a large model loading on every server
    assert awaited_server([held, also_slow], {}) is None
    assert awaited_server([held, ServerCall(8, "b:1", 1.0, None)], {}) is not None  # b: new
    assert awaited_server([held], {(9, "a:1"): 3.0}) is None  # 5 x 3 s: not yet
    found = awaited_server([held], {(9, "a:1"): 2.0})
    assert found.limit == 10.0 and "its answers to that process took at most 2.0 s" in (
        found.phrase()
    )


def test_an_answer_whose_connection_closed_is_remembered_for_the_next_polls() -> None:
    """A client that closes its connection once answered leaves the held call alone in the
    sockets: the answer seen at the poll before still tells the fan-out's pace."""
    sensor = ServerCallSensor()
    now = time.time()
    first = [ServerCall(9, "a:1", 1.0, None), ServerCall(8, "b:1", 1.0, 0.8)]
    assert awaited_server(first + sensor.remember(now, first), sensor.took) is None
    later = [ServerCall(9, "a:1", 6.0, None)]  # b's connection closed
    remembered = sensor.remember(now + 5.0, later)
    assert [(c.server, round(c.sent_ago, 3), round(c.received_ago, 3)) for c in remembered] == [
        ("b:1", 6.0, 5.8)
    ]
    found = awaited_server(later + remembered, sensor.took)
    assert (found.server, found.answered_by) == ("a:1", ("b:1",))
    assert sensor.remember(now + 400.0, []) == []  # forgotten after ANSWERS_KEPT_S


def test_a_call_whose_connection_closed_before_its_answer_was_seen_sets_the_pace() -> None:
    """AReaL's weight update closes its session once answered: a call seen awaiting at one
    reading and gone at the next took at most until then, and the next call is held to it."""
    sensor, now = ServerCallSensor(), time.time()
    sensor.remember(now, [ServerCall(9, "a:1", 2.0, None)])  # an update under way
    sensor.remember(now + 1.0, [])  # answered and closed within the poll
    assert sensor.took == {(9, "a:1"): pytest.approx(3.0)}
    later = [ServerCall(9, "a:1", 12.0, None)]  # the next update: 5 x 3 s = 15 s, not yet
    assert awaited_server(later + sensor.remember(now + 20.0, later), sensor.took) is None


class _Server(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the inference servers' uvicorn answers
    hold = threading.Event()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.server.server_address[1] == self.server.held_port:  # type: ignore[attr-defined]
            self.hold.wait(60)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def two_servers() -> Iterator[list[str]]:
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _Server) for _ in range(2)]
    for server in servers:
        server.held_port = servers[1].server_address[1]  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield [f"127.0.0.1:{s.server_address[1]}" for s in servers]
    _Server.hold.set()
    for server in servers:
        server.shutdown()
        server.server_close()


CLIENT = """
import http.client, sys, threading, time
def post(address):  # one keep-alive connection a server, as aiohttp's session keeps them
    host, port = address.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.request("POST", "/update_weights_from_disk", body=b"{}")
    connection.getresponse().read()
    time.sleep(60)
threads = [threading.Thread(target=post, args=(a,)) for a in sys.argv[1:]]
[t.start() for t in threads]
[t.join() for t in threads]
"""


def test_a_weight_update_one_real_server_never_answers_is_read_from_the_sockets(
    two_servers: list[str],
) -> None:
    """A client posts one update to both servers at once, as AReaL's fan-out does; the second
    server never answers. Past 5 s the sockets say which server keeps it waiting."""
    client = subprocess.Popen([sys.executable, "-c", CLIENT, *two_servers])
    try:
        seen, deadline = None, time.time() + 20
        while seen is None and time.time() < deadline:
            time.sleep(0.5)
            seen = awaited_server(read_server_calls({client.pid}, two_servers), {})
        assert seen is not None and seen.server == two_servers[1], seen
        assert seen.answered_by == (two_servers[0],)
        assert AWAITED_MIN_S <= seen.waited < AWAITED_MIN_S + 2
    finally:
        client.kill()
        client.wait()
