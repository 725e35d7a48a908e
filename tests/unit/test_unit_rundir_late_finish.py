"""The late finish's record: what ``areal-launch status`` says while a sidecar's pictures and
notifications go on after the job's end, once they are done, and after a late finish that was
killed outright (its deadline passed without an end)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from areal_watchdog.report.run_status import status_lines
from areal_watchdog.rundir.layout import RunLayout
from areal_watchdog.rundir.sidecar_files.late_finish import LateFinish


def record(now: float, **kw: object) -> LateFinish:
    fields = {"run_id": "r1", "node": "node1", "pid": 4242, "started": now - 3,
              "deadline": now + 60, "waiting_for": ("drawing the timeline of I1",)}  # fmt: skip
    return LateFinish(**{**fields, **kw})  # type: ignore[arg-type]


def test_status_says_what_a_late_finish_waits_for_then_how_it_ended(tmp_path: Path) -> None:
    layout, now = RunLayout(tmp_path), time.time()
    layout.watch_dir.mkdir()
    late = record(now)
    late.write(layout)
    assert any(
        "late finish on node1 (pid 4242): drawing the timeline of I1; gives up in 60 s" in line
        for line in status_lines(tmp_path, now)
    )
    late.over("done: 1 notification(s) sent, 0 left in the spool, 1 timeline(s) drawn").write(
        layout
    )
    (line,) = [line for line in status_lines(tmp_path, now) if "late finish" in line]
    assert "done: 1 notification(s) sent" in line and not LateFinish.read_all(layout)[0].running()


def test_a_late_finish_past_its_deadline_is_over_whatever_its_record_says(tmp_path: Path) -> None:
    layout, now = RunLayout(tmp_path), time.time()
    layout.watch_dir.mkdir()
    record(now, deadline=now - 1).write(layout)
    (late,) = LateFinish.read_all(layout)
    assert not late.running(now)
    assert "stopped at its limit; what was not sent stays in the spool" in late.line(now)


def test_a_torn_or_foreign_record_is_no_late_finish(tmp_path: Path) -> None:
    layout, now = RunLayout(tmp_path), time.time()
    layout.late_finish_dir.mkdir(parents=True)
    layout.late_finish("a").write_text("{")
    layout.late_finish("b").write_text(json.dumps({"run_id": "r1", "pid": "x"}))
    record(now, run_id="r2", node="c").write(layout)
    assert LateFinish.read_all(layout, run_id="r1") == []
    assert [r.node for r in LateFinish.read_all(layout)] == ["c"]
