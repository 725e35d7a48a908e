"""Keep a report readable at scale: past ``RANKS_IN_REPORT`` ranks, ``report.json`` lists the
ranks a person reads first and links one file per node for the others.

At 1,024 nodes x 8 ranks every rank's entry (its stack included) made a 4.4 MB report and a
webhook payload to match. The summary keeps the culprits, the first rank of every stack group,
and every rank that exited or could not be read; each node's full entries go to
``ranks/<node>.json`` beside the report. Pure: the incident desk splits, the writer writes.
"""

from __future__ import annotations

from typing import Any

RANKS_IN_REPORT = 256  # ranks whose entries report.json holds, at most


def split_ranks(report: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[dict]]]:
    """(the report to write and send, each node's full rank entries when they were left out)."""
    ranks = report["ranks"]
    if len(ranks) <= RANKS_IN_REPORT:
        return report, {}
    by_node: dict[str, list[dict]] = {}
    for entry in ranks:
        by_node.setdefault(str(entry["node"]), []).append(entry)
    wanted = _read_first(report)
    shown = [r for r in ranks if r["rank"] in wanted][:RANKS_IN_REPORT]
    incident_dir = report["files"]["incident_dir"]
    summary = {
        **report,
        "ranks": shown,
        "ranks_total": len(ranks),
        "files": {**report["files"], "ranks_by_node": f"{incident_dir}/ranks/<node>.json"},
    }
    return summary, by_node


def _read_first(report: dict[str, Any]) -> set[int]:
    """The culprits, the first rank of every stack group, rank 0, and every rank that exited or
    could not be read."""
    wanted = {*report["culprit_ranks"], 0}
    wanted |= {g["ranks"][0] for g in report["groups"] if g["ranks"]}
    wanted |= {r["rank"] for r in report["ranks"] if r["state"] == "exited" or r.get("error")}
    return wanted
