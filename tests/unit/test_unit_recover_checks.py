"""What ``on_hang: resume`` is checked for and told before anything runs (``recover.checks``),
and what the sinks hear once a resume was decided (``recover.notices``): the webhook's
``hang.recovery`` event and Slack's follow-up in the incident's thread, delivered to a real
receiver on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_watchdog.common.errors import UserError
from areal_watchdog.config.load import load_config
from areal_watchdog.config.model import JobConfig
from areal_watchdog.config.sinks import SinkSpec
from areal_watchdog.launch.recovery import Recovery
from areal_watchdog.notify.delivery import delivery_id
from areal_watchdog.notify.sinks.registry import sink_for
from areal_watchdog.notify.spool import Spool
from areal_watchdog.recover.checks import check_resumable, resume_notes, tokenizer_warning
from areal_watchdog.recover.notices import send_recovery
from conftest import REPO
from testkit.launcher import DEMO_CONFIG
from testkit.receiver import Receiver

AREAL = REPO / "examples" / "areal" / "gsm8k_grpo.yaml"
RESUME = "watchdog.on_hang=resume"


class Refusing(Recovery):
    """A backend that cannot resume anything."""

    def refusal(self, config: JobConfig, mode: str) -> str | None:
        return f"no resume in {mode} here"


class Remote(Recovery):
    def dry_run(self, config: JobConfig, mode: str) -> tuple[str, list[str]]:
        return "on node X", ["  in a new allocation, node Y left out"]


def test_a_backend_s_refusal_is_one_line_after_the_config_s_name_and_only_for_resume() -> None:
    with pytest.raises(UserError) as raised:
        check_resumable(load_config(DEMO_CONFIG, [RESUME]), Refusing(), "torchrun")
    assert str(raised.value) == f"{DEMO_CONFIG}: no resume in torchrun here"
    check_resumable(load_config(DEMO_CONFIG, []), Refusing(), "torchrun")  # on_hang: cancel
    check_resumable(load_config(DEMO_CONFIG, [RESUME]), Recovery(), "torchrun")


@pytest.mark.parametrize(
    ("recover", "refused"),
    [(["recover.mode=auto"], True), (["+recover.freq_steps=1"], True),
     (["recover.mode='on'", "+recover.freq_epochs=1"], False),
     (["recover.mode=auto", "+recover.freq_steps=5"], False)],
)  # fmt: skip
def test_an_areal_job_resumes_only_when_it_writes_a_recover_checkpoint(
    tmp_path: Path, recover: list[str], refused: bool
) -> None:
    config = load_config(AREAL, [f"cluster.fileroot={tmp_path}", RESUME, *recover])
    if not refused:
        check_resumable(config, Recovery(), "spmd")
        return
    with pytest.raises(UserError) as raised:
        check_resumable(config, Recovery(), "spmd")
    said = str(raised.value)
    assert said.startswith(f"{AREAL}: recover: ") and "\n" not in said
    assert said.endswith("set recover.mode: auto and recover.freq_steps: 1")


def test_recover_mode_on_written_unquoted_says_to_quote_it(tmp_path: Path) -> None:
    """YAML 1.1 reads ``mode: on`` as true: the refusal says so instead of "mode True"."""
    written = tmp_path / "areal.yaml"
    written.write_text(AREAL.read_text().replace("  mode: disabled", "  mode: on\n  freq_steps: 1"))
    (tmp_path / "gsm8k_rl.py").write_text("")
    config = load_config(written, [f"cluster.fileroot={tmp_path}", RESUME])
    with pytest.raises(UserError, match="recover.mode: YAML reads an unquoted on as true"):
        check_resumable(config, Recovery(), "spmd")


def test_only_a_torchrun_job_that_dumps_its_steps_without_a_tokenizer_is_warned(
    tmp_path: Path,
) -> None:
    demo = load_config(DEMO_CONFIG, [RESUME])
    said = tokenizer_warning(demo, "torchrun")
    assert said is not None and said.startswith(f"{DEMO_CONFIG}: tokenizer_path: ")
    assert "\n" not in said
    named = load_config(DEMO_CONFIG, [RESUME, "+tokenizer_path=/models/tok"])
    assert tokenizer_warning(named, "torchrun") is None
    assert tokenizer_warning(load_config(DEMO_CONFIG, ["+watchdog.trajectory.enabled=false"]),
                             "torchrun") is None  # fmt: skip
    assert tokenizer_warning(demo, "spmd") is None  # AReaL's actor.path names one


def test_the_dry_run_s_resume_notes_follow_the_config_and_the_backend() -> None:
    config = load_config(DEMO_CONFIG, [RESUME, "+watchdog.resume.backoff=2.5",
                                       "+watchdog.resume.max_attempts=2",
                                       "+watchdog.resume.max_replays=4"])  # fmt: skip
    notes = resume_notes(config, "torchrun", Remote())
    assert "is replayed on node X (at most 4 replays," in notes[0]
    assert notes[1] == ("then this plan runs again from the script's own checkpoint, up to 2 "
                        "time(s) (after 2.5 s, 5 s), with")  # fmt: skip
    assert notes[-2] == "  in a new allocation, node Y left out"  # the backend's own line
    assert notes[-1].endswith("same hang comes back at the same step (docs/recovery.md)")
    areal = resume_notes(config, "single_controller", Recovery())
    assert "from AReaL's recover checkpoint of the trial" in areal[1]
    assert "replayed on this node" in areal[0]


REPORT = {
    "incident_id": "20261127T000000Z-straggler-ab12",
    "job": {"experiment_name": "exp", "trial_name": "t1", "run_id": "r1"},
}
RECOVERY = {"attempt": 1, "decision": "resume", "reason": "resume 1 of 3 after straggler"}


def slack_spec(channel: str | None = "C0ALERTS") -> SinkSpec:
    return SinkSpec("slack", "ops", {"token": {"env": "SLACK_TOKEN"}},
                    {"channel": channel, "api_url": "http://127.0.0.1:9/api"})  # fmt: skip


def test_the_recovery_event_and_the_slack_follow_up_name_the_incident() -> None:
    hook = SinkSpec("webhook", "hook", {"url": {"env": "HOOK_URL"}})
    event = sink_for(hook).recovery(REPORT, RECOVERY, None)
    assert (event["event_type"], event["incident_id"]) == ("hang.recovery", REPORT["incident_id"])
    assert event["job"] == REPORT["job"] and event["recovery"] == RECOVERY
    thread = {"channel": "C0THREAD", "ts": "1795600000.000001"}
    reply = sink_for(slack_spec()).recovery(REPORT, RECOVERY, thread)
    assert reply == {
        "text": f"[areal-watchdog] exp/t1 resumed after incident {REPORT['incident_id']}: "
        "resume 1 of 3 after straggler",
        "channel": "C0THREAD",  # where the incident was posted
        "thread_ts": "1795600000.000001",
    }
    stop = {**RECOVERY, "decision": "stop"}
    alone = sink_for(slack_spec()).recovery({**REPORT, "job": {}}, stop, None)
    assert alone["text"].startswith("[areal-watchdog] ?/? not resumed after incident")
    assert alone["channel"] == "C0ALERTS" and "thread_ts" not in alone


def test_every_sink_hears_the_decision_the_bot_in_the_incident_s_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret, token = "notice-signing-secret", "xoxb-notice-test-bot-token"
    receiver = Receiver(secret)
    monkeypatch.setenv("HOOK_URL", receiver.url("/hook"))
    monkeypatch.setenv("HOOK_SECRET", secret)
    monkeypatch.setenv("SLACK_TOKEN", token)
    hook = SinkSpec(
        "webhook",
        "hook",
        {"url": {"env": "HOOK_URL"}, "secret": {"env": "HOOK_SECRET"}},
        max_attempts=1,
    )
    bot = SinkSpec("slack", "bot", {"token": {"env": "SLACK_TOKEN"}},
                   {"channel": "C0ALERTS", "api_url": receiver.url("/api/chat.postMessage")},
                   max_attempts=1)  # fmt: skip
    spool_dir = tmp_path / "spool"
    thread = {"channel": "C0ALERTS", "ts": "1795600000.000042"}  # the incident's first post
    Spool(spool_dir).mark_delivered(delivery_id(REPORT["incident_id"], bot), thread)
    said: list[str] = []
    try:
        send_recovery([hook, bot], spool_dir, REPORT, RECOVERY, said.append)
    finally:
        receiver.close()
    (event,) = [r for r in receiver.requests if r.path == "/hook"]
    assert event.verified and event.json()["event_type"] == "hang.recovery"
    assert event.json()["recovery"] == RECOVERY
    (reply,) = [r for r in receiver.requests if r.path == "/api/chat.postMessage"]
    assert reply.json()["thread_ts"] == "1795600000.000042"
    assert reply.headers["Authorization"] == f"Bearer {token}"
    assert [line.split(":")[0] for line in said] == ["recovery notice to hook",
                                                     "recovery notice to bot"]  # fmt: skip
    assert not any(token in line for line in said)
