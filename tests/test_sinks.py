"""Feishu/Lark, DingTalk, PagerDuty and Teams: each delivers a signed, valid message to a
loopback stand-in that checks what the vendor checks (testkit/standins.py), through the common
spool, retries and ledger; PagerDuty's incidents are resolved when the job recovers."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from areal_watchdog.cli import main
from areal_watchdog.common.errors import ConfigError
from areal_watchdog.common.rankset import format_ranks
from areal_watchdog.common.secrets.redact import Redactor
from areal_watchdog.config.load import load_config
from areal_watchdog.config.sinks import SinkSpec, resolve
from areal_watchdog.doctor.checks.sinks import check_sink
from areal_watchdog.notify.delivery import deliver, delivery_id, flush, send
from areal_watchdog.notify.notifier import Notifier, render
from areal_watchdog.notify.sinks.registry import parse
from areal_watchdog.notify.spool import Spool
from areal_watchdog.report.build import iso
from areal_watchdog.report.sample import sample_report
from testkit.launcher import DEMO_CONFIG
from testkit.standins import ROUTING_KEY, SECRETS, StandIn, vendor_sinks
from testkit.synthetic import synthetic_report

VENDORS = ["feishu", "dingtalk", "pagerduty", "teams"]


def secret_of(vendor: str) -> str:
    return ROUTING_KEY if vendor == "pagerduty" else SECRETS[vendor]


@pytest.fixture
def report() -> dict:
    return sample_report(load_config(DEMO_CONFIG))


@pytest.fixture
def standins(request: pytest.FixtureRequest) -> Iterator[dict[str, StandIn]]:
    fail_first = getattr(request, "param", 0)
    started = {v: StandIn(v, secret_of(v), fail_first) for v in VENDORS}
    yield started
    for standin in started.values():
        standin.close()


def specs(
    standins: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch, **common: object
) -> dict[str, SinkSpec]:
    """The stand-ins as ``watchdog.notify`` names them, checked as a config is."""
    items, env = vendor_sinks(standins)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    checked = parse([{**item, **common} for item in items], "test.yaml")
    return {spec.type: spec for spec in checked}


@pytest.mark.parametrize("standins", [2], indirect=True)
@pytest.mark.parametrize("vendor", VENDORS)
def test_a_receiver_that_fails_twice_then_answers_gets_one_signed_delivery(
    vendor: str, standins: dict[str, StandIn], report: dict, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    spec = specs(standins, monkeypatch, max_attempts=1)[vendor]
    spool, redactor = Spool(tmp_path / "spool"), Redactor()
    message_id = delivery_id(report["incident_id"], spec)
    first = deliver(resolve(spec), render(spec, report), message_id, redactor, spool)
    assert not first.delivered and first.retryable and spool.holds(message_id)
    (entry, _), = spool.pending()  # fmt: skip
    assert ROUTING_KEY not in entry["body"] and '"sign"' not in entry["body"]  # added per attempt
    assert [flush(spool, redactor), flush(spool, redactor), flush(spool, redactor)] == [
        (0, 1), (1, 0), (0, 0)]  # fmt: skip
    standin = standins[vendor]
    assert len(standin.seen) == 3 and [s.problems for s in standin.seen] == [[], [], []]
    (message,) = standin.accepted
    shown = json.dumps(message)
    assert report["category"] in shown and report["files"]["incident_dir"] in shown
    assert format_ranks(report["culprit_ranks"]) in shown


@pytest.mark.parametrize("vendor", VENDORS)
def test_long_stacks_are_cut_to_the_vendors_limit_with_a_pointer_to_the_report(
    vendor: str, standins: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    report = synthetic_report(1024, 40, name="\u5c42" * 400)  # 6 bytes a character, escaped
    spec = specs(standins, monkeypatch)[vendor]
    outcome = send(resolve(spec), render(spec, report), "msg_long", Redactor())
    assert outcome.delivered, standins[vendor].seen[-1].problems
    shown = json.dumps(standins[vendor].accepted)
    assert "more stack groups" in shown and report["files"]["incident_dir"] in shown


@pytest.mark.parametrize(("vendor", "code"), [("feishu", "19021"), ("dingtalk", "310000")])
def test_a_wrong_signing_secret_is_refused_once_and_said(
    vendor: str, code: str, standins: dict[str, StandIn], report: dict,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    spec = specs(standins, monkeypatch, max_attempts=3, backoff=0)[vendor]
    monkeypatch.setenv(f"{vendor.upper()}_SECRET", "not-the-bot-s-secret")
    sink = resolve(spec)
    outcome = send(
        sink, render(spec, report), "msg_x", Redactor().with_values(sink.secret_values())
    )
    assert (outcome.delivered, outcome.retryable, outcome.attempts) == (False, False, 1)
    assert code in outcome.error and "not-the-bot-s-secret" not in outcome.error


def test_pagerduty_pages_a_hang_and_resolves_it_when_progress_resumes(
    standins: dict[str, StandIn], report: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hang left running (``on_hang: report``) is an ``error``, a job ended for it
    ``critical``, damage and a possible livelock a ``warning``; a step after the hang resolves
    it and the livelock, the damage stays open until the job completes."""
    spec = specs(standins, monkeypatch)["pagerduty"]
    said: list[str] = []
    notifier = Notifier([spec], tmp_path / "spool", Redactor(), said.append,
                        incidents_dir=tmp_path / "incidents")  # fmt: skip
    now = time.time()
    hang = {**report, "incident_id": "i-hang", "detected_at": iso(now - 10)}
    damage = {**report, "incident_id": "i-damage", "confirmation": {"warning": True}}
    livelock = {**report, "incident_id": "i-livelock", "detected_at": iso(now - 5),
                "confirmation": {"warning": True, "livelock": {"ranks": [2]}}}  # fmt: skip
    ended = {**report, "incident_id": "i-ended", "action": "cancel", "detected_at": iso(now + 5)}
    for posted in (hang, damage, livelock, ended):
        notifier.submit(posted)
    notifier.progressed(now - 20, 4)  # the step before the hang
    notifier.progressed(now, 5)
    notifier.progressed(now + 1, 6)
    notifier.ended_well()
    notifier.close(20)
    events = [(e["event_action"], e["dedup_key"]) for e in standins["pagerduty"].accepted]
    assert events == [
        ("trigger", "i-hang"), ("trigger", "i-damage"), ("trigger", "i-livelock"),
        ("trigger", "i-ended"), ("resolve", "i-hang"), ("resolve", "i-livelock"),
        ("resolve", "i-damage"), ("resolve", "i-ended"),
    ]  # fmt: skip
    severities = [e["payload"]["severity"] for e in standins["pagerduty"].accepted[:4]]
    assert severities == ["error", "warning", "warning", "critical"]
    assert any("incident i-hang is over (progress resumed (step 5))" in line for line in said)


def test_a_resumed_attempt_resolves_the_incidents_of_the_one_before_once(
    standins: dict[str, StandIn], report: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = specs(standins, monkeypatch)["pagerduty"]
    incident = tmp_path / "incidents" / "i-before"
    incident.mkdir(parents=True)
    before = {**report, "incident_id": "i-before", "detected_at": iso(time.time() - 60)}
    (incident / "report.json").write_text(json.dumps(before))
    for _attempt in range(2):  # the second finds it resolved in the ledger
        notifier = Notifier([spec], tmp_path / "spool", Redactor(), print,
                            incidents_dir=tmp_path / "incidents")  # fmt: skip
        notifier.progressed(time.time(), 1)
        notifier.close(20)
    assert [(e["event_action"], e["dedup_key"]) for e in standins["pagerduty"].accepted] == [
        ("resolve", "i-before")
    ]


def test_a_planted_link_in_the_incidents_folder_is_never_resolved(
    standins: dict[str, StandIn], report: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resumed sidecar reads the earlier incidents: a report.json, or an incident folder,
    that is a link to somewhere else is not one of them."""
    spec = specs(standins, monkeypatch)["pagerduty"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "report.json").write_text(json.dumps({**report, "incident_id": "i-planted"}))
    incidents = tmp_path / "incidents"
    (incidents / "i-file").mkdir(parents=True)
    (incidents / "i-file" / "report.json").symlink_to(elsewhere / "report.json")
    (incidents / "i-folder").symlink_to(elsewhere)
    notifier = Notifier([spec], tmp_path / "spool", Redactor(), print, incidents_dir=incidents)
    notifier.progressed(time.time(), 1)
    notifier.close(20)
    assert standins["pagerduty"].seen == []


@pytest.mark.parametrize(
    ("item", "key", "says"),
    [
        ({"type": "feishu", "url_env": "U"}, "secret_env", "is missing"),
        ({"type": "pagerduty", "routing_key": "R0UT"}, "routing_key", "secrets never sit"),
        ({"type": "teams", "url_env": "U", "chanel": "x"}, "chanel", "unknown key"),
        ({"type": "pager", "url_env": "U"}, "type", "no sink type 'pager' (installed: slack,"),
        ({"type": "pagerduty", "routing_key_env": "K", "api_url": 3}, "api_url", "must be a str"),
        ({"type": "dingtalk", "url_env": "U", "url_file": "/f", "secret_env": "S"}, "url_env",
         "not both"),
    ],
)  # fmt: skip
def test_a_sinks_own_keys_are_checked_with_the_key_named(item: dict, key: str, says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse([item], "c.yaml")
    assert str(refused.value).startswith(f"c.yaml: `watchdog.notify[0].{key}`: ")
    assert says in str(refused.value)


def test_notify_test_sends_a_sample_to_each_and_closes_the_test_page(
    standins: dict[str, StandIn], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    items, env = vendor_sinks(standins)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    notify = json.dumps(items)
    assert main(["notify-test", str(DEMO_CONFIG), f"+watchdog.notify={notify}"]) == 0
    out = capsys.readouterr().out
    for vendor in VENDORS:
        assert f"{vendor}-{VENDORS.index(vendor)} ({vendor}): delivered (HTTP 20" in out, out
        assert len(standins[vendor].accepted) == (2 if vendor == "pagerduty" else 1)
    assert "pagerduty-2 (pagerduty): resolved the sample: delivered" in out
    assert not any(value in out for value in env.values())


def test_doctor_reaches_each_sink_and_sends_nothing(
    standins: dict[str, StandIn], monkeypatch: pytest.MonkeyPatch
) -> None:
    for vendor, spec in specs(standins, monkeypatch).items():
        check = check_sink(spec)
        assert check.status == "pass" and "nothing sent" in check.detail, check
        assert check.name == f"notify {vendor}-{VENDORS.index(vendor)} ({vendor})"
    assert all(s.seen == [] for s in standins.values())
