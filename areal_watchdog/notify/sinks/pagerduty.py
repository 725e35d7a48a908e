"""PagerDuty Events API v2: ``trigger`` for a posted report, its ``dedup_key`` the incident
id, its severity from the action (a job ended for it: critical; left running: error; damage
posted while the job goes on: warning), and ``resolve`` when progress resumes or the job ends
well. A suspected look is never posted, so never paged. The vendor's rules: the routing key in
the body, a summary of at most 1,024 characters, an event of at most 512 KB, 202 when
accepted."""

from __future__ import annotations

import json
from typing import Any

from areal_watchdog.notify.digest import (
    clip,
    facts,
    fit,
    group_lines,
    headline,
    job_name,
    replay_command,
    report_path,
)
from areal_watchdog.notify.envelope import encode, is_warning
from areal_watchdog.notify.sinks.base import Keys, Option, Request, Sink

EVENTS_API = "https://events.pagerduty.com/v2/enqueue"
MAX_BODY_BYTES = 512 * 1024
MAX_SUMMARY = 1024


class PagerDutySink(Sink):
    type = "pagerduty"
    keys = Keys(
        {"routing_key": "the service's Events API v2 integration key"},
        (("routing_key",),),
        {"api_url": Option(EVENTS_API, "the Events API (EU: events.eu.pagerduty.com)")},
    )
    resolves = True

    def endpoint(self, values: dict[str, str]) -> str:
        return self.option("api_url")

    def report(self, report: dict[str, Any]) -> dict[str, Any]:
        return fit(_trigger, report, MAX_BODY_BYTES)

    def resolution(self, report: dict[str, Any], reason: str) -> dict[str, Any]:
        return {"event_action": "resolve", "dedup_key": report["incident_id"]}

    def request(self, values: dict[str, str], body: bytes, message_id: str, now: float) -> Request:
        keyed = {**json.loads(body), "routing_key": values["routing_key"]}
        return Request(self.endpoint(values), encode(keyed))


def severity(report: dict[str, Any]) -> str:
    """critical: the job is ended for it; error: it runs on; warning: damage while it runs."""
    if is_warning(report):
        return "warning"
    return "error" if report.get("action") == "report" else "critical"


def _trigger(report: dict[str, Any], shown: int) -> dict[str, Any]:
    details: dict[str, Any] = {k.lower().replace(" ", "_"): v for k, v in facts(report)}
    details.update(stacks=group_lines(report, shown), report=report_path(report))
    if replay_command(report):
        details["replay"] = replay_command(report)
    nodes = report["culprit_nodes"] or report["job"].get("nodes") or []
    return {
        "event_action": "trigger",
        "dedup_key": report["incident_id"],
        "client": "areal-watchdog",
        "payload": {
            "summary": clip(f"{headline(report)}: {report['summary']}", MAX_SUMMARY),
            "source": ", ".join(nodes[:5]) or job_name(report),
            "severity": severity(report),
            "timestamp": report["detected_at"],
            "component": job_name(report),
            "class": report["category"],
            "custom_details": details,
        },
    }
