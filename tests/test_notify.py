"""Notifications against a real HTTP receiver on 127.0.0.1: signatures, retries, spool, Slack."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from areal_watchdog.cli import main
from areal_watchdog.common.errors import ConfigError
from areal_watchdog.common.secrets.redact import Redactor
from areal_watchdog.config.load import load_config
from areal_watchdog.config.sinks import SecretError, SinkSpec, resolve
from areal_watchdog.notify.delivery import delivery_id, flush, send
from areal_watchdog.notify.envelope import ENVELOPE_SCHEMA, verify
from areal_watchdog.notify.notifier import Notifier, Picture, render
from areal_watchdog.notify.sinks.deadline_post import GRACE
from areal_watchdog.notify.sinks.registry import parse as parse_sinks
from areal_watchdog.notify.sinks.slack.message import (
    MAX_GROUPS_SHOWN,
    build_slack_message,
    check_limits,
)
from areal_watchdog.notify.spool import Spool
from areal_watchdog.report.sample import sample_report
from areal_watchdog.rundir.layout import RunLayout
from testkit.launcher import DEMO_CONFIG
from testkit.receiver import Receiver, Trickler
from testkit.synthetic import synthetic_report

SECRET = "s3cret-signing-key"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver(SECRET)
    yield server
    server.close()


@pytest.fixture
def report() -> dict:
    return sample_report(load_config(DEMO_CONFIG))


def webhook(url: str, **kw: object) -> SinkSpec:
    os.environ["TEST_HOOK_URL"] = url
    os.environ["TEST_HOOK_SECRET"] = SECRET
    item = {
        "type": "webhook",
        "url_env": "TEST_HOOK_URL",
        "secret_env": "TEST_HOOK_SECRET",
        "backoff": 0.05,
        **kw,
    }
    return parse_sinks([item], "test.yaml")[0]


def deliver(spec: SinkSpec, report: dict) -> object:
    return send(
        resolve(spec), render(spec, report), delivery_id(report["incident_id"], spec), Redactor()
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_signed_envelope_is_delivered_and_verifies(receiver: Receiver, report: dict) -> None:
    outcome = deliver(webhook(receiver.url()), report)
    assert outcome.delivered and outcome.attempts == 1
    (request,) = receiver.requests
    assert request.verified
    envelope = request.json()
    assert envelope["schema"] == ENVELOPE_SCHEMA and envelope["event_type"] == "hang.detected"
    assert envelope["verdict"]["category"] == "collective_mismatch"
    assert envelope["verdict"]["culprit_ranks"] == [3]
    assert envelope["incident_id"] == report["incident_id"]
    assert request.headers["X-Hub-Signature-256"].startswith("sha256=")
    assert not verify(request.body + b" ", request.headers, SECRET)  # tampering is caught


def test_500_then_success_is_one_delivery_with_one_id(receiver: Receiver, report: dict) -> None:
    receiver.script = [(500, {}, 0.0)]
    outcome = deliver(webhook(receiver.url()), report)
    assert outcome.delivered and outcome.attempts == 2
    ids = receiver.delivered_ids()
    assert len(ids) == 2 and len(set(ids)) == 1
    assert all(r.verified for r in receiver.requests)


def test_429_retry_after_is_honoured(receiver: Receiver, report: dict) -> None:
    receiver.script = [(429, {"Retry-After": "2"}, 0.0)]
    outcome = deliver(webhook(receiver.url()), report)
    first, second = receiver.requests
    assert outcome.delivered
    assert second.at - first.at >= 2.0


def test_400_is_not_retried_and_logged_without_secrets(receiver: Receiver, report: dict) -> None:
    receiver.script = [(400, {}, 0.0)]
    spec = webhook(receiver.url())
    sink = resolve(spec)
    outcome = send(
        sink, render(spec, report), "msg_x", Redactor(["hunter2secret", *sink.secret_values()])
    )
    assert not outcome.delivered and not outcome.retryable
    assert len(receiver.requests) == 1
    assert "HTTP 400" in outcome.describe() and "go away" in outcome.describe()
    assert "hunter2secret" not in outcome.describe()


def test_receiver_down_then_up_is_spooled_then_delivered_once(tmp_path: Path, report: dict) -> None:
    port = free_port()
    spec = webhook(f"http://127.0.0.1:{port}/hook", max_attempts=2)
    notifier = Notifier(
        [spec], tmp_path / "spool", Redactor(), lambda m: None, spool_retry_interval=0.5
    )
    notifier.submit(report)
    spool = Spool(tmp_path / "spool")
    deadline = time.time() + 10
    while time.time() < deadline and (
        "not sent yet" in json.dumps([e for e, _ in spool.pending()]) or not spool.pending()
    ):
        time.sleep(0.1)
    assert len(spool.pending()) == 1 and "ConnectionError" in spool.pending()[0][0]["last_error"]
    receiver = Receiver(SECRET, port=port)  # the receiver comes back
    try:
        deadline = time.time() + 10
        while time.time() < deadline and not receiver.requests:
            time.sleep(0.1)
        time.sleep(1.5)  # more spool rounds: nothing may be sent again
        notifier.close(timeout=5)
        assert len(receiver.requests) == 1 and receiver.requests[0].verified
        assert spool.pending() == []
        assert flush(spool, Redactor()) == (0, 0)
    finally:
        receiver.close()


def test_receiver_that_never_answers_does_not_block(
    receiver: Receiver, tmp_path: Path, report: dict
) -> None:
    receiver.script = [(200, {}, 30.0)] * 3
    spec = webhook(receiver.url(), timeout=1, max_attempts=2)
    notifier = Notifier([spec], tmp_path / "spool", Redactor(), lambda m: None)
    started = time.monotonic()
    notifier.submit(report)
    assert time.monotonic() - started < 0.1  # detection goes on at once
    deadline = time.time() + 15
    while time.time() < deadline and len(receiver.requests) < 2:
        time.sleep(0.1)
    notifier.close(timeout=5)
    ((entry, _),) = Spool(tmp_path / "spool").pending()
    assert "ReadTimeout" in entry["last_error"]


@pytest.mark.parametrize(("world", "groups"), [(2, 2), (64, 5), (1024, 40)])
def test_slack_message_stays_inside_limits(world: int, groups: int) -> None:
    report = synthetic_report(world, groups)
    message = build_slack_message(report)
    assert check_limits(message) == []
    assert message["text"].startswith("[areal-watchdog] collective_mismatch")
    texts = json.dumps(message)
    assert "collective_mismatch in exp/trial" in texts
    assert report["files"]["incident_dir"] in texts
    folded = len(report["groups"]) > MAX_GROUPS_SHOWN
    assert ("more stack groups" in texts) == folded, len(report["groups"])


def test_slack_fold_for_1024_ranks_and_40_groups() -> None:
    report = synthetic_report(1024, 40)
    assert len(report["groups"]) >= 40
    message = build_slack_message(report)
    assert len(message["blocks"]) <= 50
    assert "more stack groups" in json.dumps(message)


def test_secrets_never_sit_in_the_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="use url_env"):
        parse_sinks([{"type": "webhook", "url": "https://x.example/hook"}], "c.yaml")
    secret_file = tmp_path / "secret"
    secret_file.write_text("abcdefgh")
    secret_file.chmod(0o644)
    spec = parse_sinks([{"type": "webhook", "url_file": str(secret_file)}], "c.yaml")[0]
    with pytest.raises(Exception, match="readable by others.*chmod 600"):
        resolve(spec)
    secret_file.chmod(0o600)
    assert resolve(spec).values["url"] == "abcdefgh"


def test_notify_test_command_reports_each_sink(
    receiver: Receiver,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TEST_HOOK_URL", receiver.url())
    monkeypatch.setenv("TEST_HOOK_SECRET", SECRET)
    monkeypatch.setenv("TEST_SLACK_URL", receiver.url("/slack"))
    monkeypatch.delenv("MISSING_URL", raising=False)
    overrides = [
        "+watchdog.notify=[{type: webhook, url_env: TEST_HOOK_URL, secret_env: TEST_HOOK_SECRET},"
        " {type: slack, webhook_url_env: TEST_SLACK_URL},"
        " {type: webhook, name: broken, url_env: MISSING_URL}]",
    ]
    code = main(["notify-test", str(DEMO_CONFIG), *overrides])
    out = capsys.readouterr().out
    assert code == 1  # one sink could not be reached
    assert "webhook-0 (webhook): delivered (HTTP 200" in out
    assert "slack-1 (slack): delivered (HTTP 200" in out
    assert "broken (webhook): not sent: sink broken: environment variable MISSING_URL" in out
    assert receiver.url() not in out
    slack = next(r for r in receiver.requests if r.path == "/slack").json()
    assert check_limits(slack) == [] and "TEST from areal-launch notify-test" in slack["text"]


def post_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "areal-watchdog-post" and t.is_alive()]


def wait_until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not condition():
        time.sleep(0.05)
    return condition()


def test_a_trickling_receiver_cannot_hold_a_delivery_past_its_timeout(report: dict) -> None:
    """One byte every 2 s, status line first: no single read times out, so only a total
    deadline per attempt ends it (before: notify-test hung for the whole response)."""
    trickler = Trickler(interval=2.0)
    try:
        started = time.monotonic()
        outcome = deliver(webhook(trickler.url(), timeout=3, max_attempts=2), report)
        took = time.monotonic() - started
        assert wait_until(lambda: trickler.hung_up == 2, 5), trickler.hung_up
    finally:
        trickler.close()
    assert not outcome.delivered and "no complete answer within 3 s" in outcome.error
    assert trickler.connections == 2
    assert took < 2 * (3 + GRACE) + 1.5, took  # two attempts, each within its deadline
    assert post_threads() == []  # the abandoned attempts' sockets were shut, not left reading


def test_notify_test_command_ends_at_the_sinks_timeout_against_a_trickler(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    trickler = Trickler(interval=2.0)
    monkeypatch.setenv("TRICKLE_URL", trickler.url())
    sink = "{type: webhook, name: slow, url_env: TRICKLE_URL, timeout: 3, max_attempts: 1}"
    try:
        started = time.monotonic()
        code = main(["notify-test", str(DEMO_CONFIG), f"+watchdog.notify=[{sink}]"])
        took = time.monotonic() - started
    finally:
        trickler.close()
    out = capsys.readouterr().out
    assert code == 1, out
    assert (
        "slow (webhook): failed after 1 attempt(s): Timeout: no complete answer within 3 s" in out
    )
    assert took < 3 + GRACE + 1.5, took


@pytest.fixture
def tiny_job(tmp_path: Path) -> Path:
    """A config whose job prints one line and ends: a launch costs only the launcher's time."""
    (tmp_path / "train.py").write_text("print('tiny job done')\n")
    config = tmp_path / "config.yaml"
    config.write_text(
        f"experiment_name: notify\ntrial_name: t1\ncluster: {{fileroot: {tmp_path / 'root'}}}\n"
        "launch: {entrypoint: train.py, nproc_per_node: 1}\n"
    )
    return config


def spool_of(config: Path) -> Spool:
    return Spool(RunLayout(load_config(config).run_dir).spool_dir)


def test_the_spool_flush_before_a_launch_ends_at_the_sinks_timeout(
    tiny_job: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    trickler = Trickler(interval=2.0)
    monkeypatch.setenv("TRICKLE_URL", trickler.url())
    spec = parse_sinks(
        [{"type": "webhook", "url_env": "TRICKLE_URL", "timeout": 2, "max_attempts": 1}], "c.yaml"
    )[0]
    spool_of(tiny_job).keep("msg_left_by_an_earlier_run", spec, b"{}", "ConnectionError")
    try:
        started = time.monotonic()
        code = main(["local", str(tiny_job)])
        took = time.monotonic() - started
    finally:
        trickler.close()
    out = capfd.readouterr().out
    assert code == 0 and "tiny job done" in out, out
    assert "spooled notifications: 0 delivered, 1 still pending" in out
    assert trickler.connections == 1 and took < 30, took  # the trickle alone lasts 80 s


def test_a_damaged_spool_ledger_is_read_past(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    spool.mark_delivered("a")
    spool.mark_delivered("b")
    with open(spool.delivered_log, "a", encoding="utf-8") as fh:
        fh.write('{"id": "c", "ti')  # a crash or a full disk cut the last line
    assert spool.delivered_ids() == {"a", "b"}
    spool.mark_delivered("d")
    assert spool.delivered_ids() == {"a", "b", "d"}


def test_a_whsec_secret_that_is_not_base64_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = webhook("http://127.0.0.1:9/hook")
    monkeypatch.setenv("TEST_HOOK_SECRET", "whsec_not*base64!")
    with pytest.raises(SecretError, match="whsec_ secret must be base64"):
        resolve(spec)


DAMAGED_LEDGER = b'{"id": "msg_a", "time": 1}\n\xff\xfe junk\n[1, 2]\n{"id": "msg_c", "ti'


def test_a_damaged_ledger_and_spool_entry_do_not_stop_a_launch(
    tiny_job: Path, receiver: Receiver, capfd: pytest.CaptureFixture[str]
) -> None:
    """A truncated last line, junk bytes and a spool entry that is not ours: the launch's spool
    flush delivers what it can, warns once about each file, and the job runs."""
    spool = spool_of(tiny_job)
    spool.keep("msg_pending", webhook(receiver.url()), b'{"x": 1}', "ConnectionError")
    spool.delivered_log.write_bytes(DAMAGED_LEDGER)
    (spool.directory / "msg_broken.json").write_text('["not", "an", "entry"]')
    code = main(["local", str(tiny_job)])
    out = capfd.readouterr().out
    assert code == 0 and "tiny job done" in out, out
    assert out.count("damaged line(s) skipped") == 1 and "3 damaged line(s)" in out
    assert out.count("msg_broken.json is damaged: skipped") == 1
    assert "spooled notifications: 1 delivered, 0 still pending" in out
    assert (
        len(receiver.requests) == 1 and receiver.requests[0].headers["webhook-id"] == "msg_pending"
    )
    assert {"msg_a", "msg_pending"} <= Spool(spool.directory).delivered_ids()


def test_the_notifier_thread_survives_a_damaged_ledger_and_its_own_errors(
    tmp_path: Path, receiver: Receiver, report: dict
) -> None:
    said: list[str] = []
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    (spool_dir / "delivered.jsonl").write_bytes(DAMAGED_LEDGER)
    notifier = Notifier(
        [webhook(receiver.url())], spool_dir, Redactor(), lambda m: None, say=said.append
    )
    try:
        notifier.submit({"incident_id": "broken"})  # rendering this one fails inside the thread
        notifier.submit(report)
        assert wait_until(lambda: len(receiver.requests) == 1, 10), said
        second = {**report, "incident_id": report["incident_id"] + "-2"}
        notifier.submit(second)
        assert wait_until(lambda: len(receiver.requests) == 2, 10), said
        assert notifier.thread.is_alive()
    finally:
        notifier.close(timeout=5)
    assert sum("damaged line(s) skipped" in m for m in said) == 1, said
    assert any(m.startswith("notifier error (KeyError") and "still running" in m for m in said)


@pytest.mark.parametrize(
    ("status", "words"),
    [(500, "failed after 1 attempt(s)"), (400, "refused by the receiver (HTTP 400: go away")],
)
def test_a_sink_that_gives_up_is_said_with_the_spool_path(
    tmp_path: Path, receiver: Receiver, report: dict, status: int, words: str
) -> None:
    said: list[str] = []
    receiver.script = [(status, {}, 0.0)]
    spec = webhook(receiver.url(), max_attempts=1)
    notifier = Notifier([spec], tmp_path / "spool", Redactor(), lambda m: None, say=said.append)
    notifier.submit(report)
    notifier.close(timeout=10)
    (line,) = said
    assert f"notification to {spec.name}" in line and words in line, line
    outcome = "spooled" if status == 500 else "refused"  # what the metrics count
    assert (notifier.deliveries, notifier.spool_depth) == ({(spec.name, outcome): 1}, status == 500)
    if status == 500:
        assert f"kept in {tmp_path / 'spool'}" in line
        assert len(Spool(tmp_path / "spool").pending()) == 1
    else:
        assert Spool(tmp_path / "spool").pending() == []


def test_a_slack_bot_posts_to_its_channel_and_slacks_refusal_in_a_200_is_no_delivery(
    receiver: Receiver, report: dict
) -> None:
    """With a bot token Slack's Web API answers every post with 200: ``ok`` and the message's
    ts (a later reply threads under it), or an error, which is no delivery."""
    os.environ["TEST_SLACK_TOKEN"] = "xoxb-test-token"

    def bot(path: str) -> SinkSpec:
        item = {"type": "slack", "token_env": "TEST_SLACK_TOKEN", "channel": "C0ALERTS",
                "api_url": receiver.url(path), "backoff": 0.05}  # fmt: skip
        return parse_sinks([item], "c.yaml")[0]

    posted = deliver(bot("/api/chat.postMessage"), report)
    assert posted.delivered and posted.thread == {"channel": "C0ALERTS", "ts": "1795600000.000001"}
    (request,) = receiver.requests
    assert request.json()["channel"] == "C0ALERTS"
    assert request.headers["Authorization"] == "Bearer xoxb-test-token"
    refused = deliver(bot("/not-slack"), report)  # answers 200 "ok", not Slack's JSON
    assert not refused.delivered and not refused.retryable
    assert "Slack API: the answer is not JSON" in refused.describe()
    with pytest.raises(ConfigError, match="channel`: is missing: a bot token posts to a channel"):
        parse_sinks([{"type": "slack", "token_env": "T"}], "c.yaml")
    with pytest.raises(ConfigError, match="give a token or a webhook_url, not both"):
        parse_sinks([{"type": "slack", "token_env": "T", "webhook_url_env": "U", "channel": "C"}],
                    "c.yaml")  # fmt: skip
    with pytest.raises(ConfigError, match="use token_env"):
        parse_sinks([{"type": "slack", "token": "xoxb-1", "channel": "C"}], "c.yaml")


def test_a_timeline_goes_into_the_reports_slack_thread_through_slacks_upload_api(
    receiver: Receiver, report: dict, tmp_path: Path
) -> None:
    """The notifier posts the report, then the drawn picture: a URL from
    ``files.getUploadURLExternal`` (the PNG's length announced), the bytes posted there, then
    ``files.completeUploadExternal`` shares it as a reply to the report's first post."""
    os.environ["TEST_SLACK_TOKEN"] = "xoxb-upload-token"
    item = {"type": "slack", "token_env": "TEST_SLACK_TOKEN", "channel": "C0ALERTS",
            "api_url": receiver.url("/api/chat.postMessage")}  # fmt: skip
    notifier = Notifier(parse_sinks([item], "c.yaml"), tmp_path / "spool", Redactor(), print)
    png = tmp_path / "timeline.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(5000))
    notifier.submit(report)
    notifier.submit_picture(Picture(report["incident_id"], png, "Timeline"))
    notifier.close(timeout=20)
    paths = [r.path for r in receiver.requests]
    assert paths == ["/api/chat.postMessage", "/api/files.getUploadURLExternal",
                     "/upload/F0TIMELINE", "/api/files.completeUploadExternal"]  # fmt: skip
    assert receiver.requests[2].body == png.read_bytes()  # the announced length, all of it
    share = receiver.requests[3].json()
    assert share == {"channel_id": "C0ALERTS", "thread_ts": "1795600000.000001",
                     "files": [{"id": "F0TIMELINE", "title": "Timeline"}]}  # fmt: skip
    api = [r for r in receiver.requests if r.path.startswith("/api/")]
    assert {r.headers["Authorization"] for r in api} == {"Bearer xoxb-upload-token"}
    assert "Authorization" not in receiver.requests[2].headers  # never to the upload URL


def test_a_close_that_runs_out_of_time_hands_the_rest_on(
    receiver: Receiver, tmp_path: Path, report: dict
) -> None:
    """The sidecar's exit never waits for a slow channel: the report being sent is in the spool
    (written ahead), the ones still queued are put there, the pictures come back to the caller,
    and one flush later every report is delivered."""
    receiver.script = [(200, {}, 3.0)]
    notifier = Notifier([webhook(receiver.url())], tmp_path / "spool", Redactor(), print)
    second = {**report, "incident_id": "20260101T000000Z-straggler-beef"}
    picture = Picture(second["incident_id"], tmp_path / "timeline.png", "Timeline")
    notifier.submit(report)
    notifier.submit(second)
    notifier.queue.put(picture)
    time.sleep(0.3)  # the first report is on its way: 3 s at the receiver
    started = time.monotonic()
    assert notifier.close(timeout=0.5) == [picture]
    assert time.monotonic() - started < 1.0
    spool = Spool(tmp_path / "spool")
    assert len(spool.pending()) == 2 and notifier.unsent() == 2
    time.sleep(3.0)  # the first attempt's answer comes: delivered, off the spool
    assert flush(spool, Redactor()) == (1, 0)
    ids = {json.loads(r.body)["incident_id"] for r in receiver.requests if r.verified}
    assert ids == {report["incident_id"], second["incident_id"]}
    assert spool.pending() == []
