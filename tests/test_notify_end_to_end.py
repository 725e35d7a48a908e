"""A real local hang reaches a real receiver as one signed webhook and one Slack message, and
the vendors' stand-ins as one valid, signed Feishu card, DingTalk markdown, PagerDuty trigger
and Teams card, with no secret from the job's environment anywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_watchdog.notify.sinks.slack.message import check_limits
from conftest import FAST
from testkit.launcher import Launcher
from testkit.receiver import Receiver
from testkit.standins import ROUTING_KEY, start_all, vendor_sinks

pytestmark = pytest.mark.slow

SECRET = "e2e-signing-secret"
WANDB = "wandb-key-0123456789abcdef"
HF = "hf_TOKENabcdefghijklmnop"
EXTRA = "launch-env-only-0123456789"  # reaches the ranks through launch.env, not the sidecar


def test_real_hang_is_delivered_signed_and_scrubbed(launcher: Launcher) -> None:
    receiver = Receiver(SECRET)
    vendors = start_all()
    items, vendor_env = vendor_sinks(vendors)
    try:
        env = {
            **vendor_env,
            "HOOK_URL": receiver.url("/hook"),
            "HOOK_SECRET": SECRET,
            "SLACK_URL": receiver.url("/slack"),
            "WANDB_API_KEY": WANDB,
            "HF_TOKEN": HF,
        }
        notify = (
            "+watchdog.notify=[{type: webhook, url_env: HOOK_URL, secret_env: HOOK_SECRET},"
            f" {{type: slack, webhook_url_env: SLACK_URL}}, {', '.join(map(json.dumps, items))}]"
        )
        result = launcher.run(
            [
                *FAST,
                notify,
                f"+launch.env.EXTRA_API_KEY={EXTRA}",
                "launch.nproc_per_node=3",
                "demo.log_env=true",
                "demo.hang=collective_mismatch",
                "demo.hang_rank=2",
                "demo.hang_step=2",
            ],
            env=env,
        )
    finally:
        receiver.close()
        for standin in vendors.values():
            standin.close()
    assert result.returncode == 3, result.output[-3000:]
    (report,) = result.reports
    hooks = [r for r in receiver.requests if r.path == "/hook"]
    slacks = [r for r in receiver.requests if r.path == "/slack"]
    assert len(hooks) == 1 and len(slacks) == 1
    assert hooks[0].verified
    envelope = hooks[0].json()
    assert envelope["verdict"]["category"] == "collective_mismatch"
    assert envelope["verdict"]["culprit_ranks"] == [2]
    slack = slacks[0].json()
    assert check_limits(slack) == []
    assert "collective_mismatch" in slack["text"] and "Culprit ranks*\\n2" in json.dumps(slack)

    for vendor, standin in vendors.items():
        assert [s.problems for s in standin.seen] == [[]], vendor  # one valid, signed message
        shown = json.dumps(standin.accepted)
        assert "collective_mismatch" in shown and report["files"]["incident_dir"] in shown
    page = vendors["pagerduty"].accepted[0]
    assert (page["dedup_key"], page["payload"]["severity"]) == (report["incident_id"], "critical")

    incident = Path(report["files"]["incident_dir"])
    assert WANDB in result.output  # the job printed it itself, from the launcher's environment
    assert "EXTRA_API_KEY=***" in result.output and EXTRA not in result.output  # launch.env's
    ours = [*incident.rglob("*"), *(result.run_dir / "watchdog" / "logs").glob("sidecar_*")]
    texts = [p.read_text(errors="replace") for p in ours if p.is_file()]
    texts += [r.body.decode() for r in receiver.requests]
    texts += [
        s.body.decode() for v in vendors.values() for s in v.seen if v is not vendors["pagerduty"]
    ]  # its routing key is the credential the body carries
    assert any("environment:" in t for t in texts)  # the log tail with the env line is there
    for text in texts:
        assert WANDB not in text and HF not in text and SECRET not in text and EXTRA not in text
        assert receiver.url("/hook") not in text and ROUTING_KEY not in text
        assert not any(url in text for url in vendor_env.values() if url.startswith("http"))
    delay = hooks[0].wall - (incident / "report.json").stat().st_mtime
    print(f"report on disk -> webhook received: {delay * 1000:.0f} ms")
    assert delay < 5
