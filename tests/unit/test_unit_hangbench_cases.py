"""HangBench's cases hold their format: every case.yaml has a label the runner reads, names a
program that exists and a kind the watchdog knows, and a third of the cases are healthy."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from areal_watchdog.diagnose.kinds import CATEGORIES, CAUSES
from benchmarks.hangbench.cases import CASES, CaseError, load_case, load_cases
from benchmarks.hangbench.runs import Launch
from benchmarks.hangbench.tools import AreaLWatchdog

KINDS = {k.name for k in (*CATEGORIES, *CAUSES)}


def test_every_case_has_a_label_the_runner_reads() -> None:
    cases = load_cases()
    assert len(cases) >= 30 and 3 * sum(c.label.healthy for c in cases) >= len(cases)
    for case in cases:
        assert case.program.is_file(), case.name
        if case.label.healthy:
            continue
        assert case.label.kind in KINDS, case.name
        per_node = case.config["launch"].get("nproc_per_node")  # AReaL: its backend's dN
        per_node = per_node or int(case.config["actor"]["backend"].rpartition(":d")[2])
        world = per_node * case.config["cluster"]["n_nodes"]
        assert all(0 <= r < world for r in case.label.culprit_ranks), case.name
        settings = case.config.get("demo") or case.config.get("scenario") or {}
        assert case.label.after_step <= int(settings.get("steps", 10**6)), case.name


def test_the_cases_place_every_torchrun_hang_early_and_late() -> None:
    """Every kind the gloo demo can hang in, at step 2-4 and after the warm-up."""
    hangs = [c for c in load_cases() if not c.label.healthy]
    early = {c.label.kind for c in hangs if 1 <= c.label.after_step <= 3}
    late = {c.label.kind for c in hangs if c.label.after_step >= 5}
    demo = {"collective_mismatch", "collective_stuck", "cleanup_deadlock", "straggler",
            "dataloader_stall", "p2p_mismatch", "rank_crashed"}  # fmt: skip
    assert demo <= early and demo <= late
    assert "init_deadlock" in {c.label.kind for c in hangs}


def test_the_quick_third_has_a_third_healthy_and_every_demo_hang_kind() -> None:
    """``--quick`` checks a claim in under 15 minutes: a third of the cases, a third of those
    healthy (slow phases past the watchdog's threshold among them), none that needs a cluster
    or waits a long limit, and hangs of every kind the gloo demo makes."""
    cases = load_cases()
    quick = [c for c in cases if c.quick]
    assert 3 * len(quick) >= len(cases) - 1 and 3 * sum(c.label.healthy for c in quick) >= len(
        quick
    )
    assert all(not {"slurm", "vllm"} & set(c.needs) and c.limit <= 30 for c in quick)
    kinds = {c.label.kind for c in quick if not c.label.healthy}
    assert {"collective_mismatch", "collective_stuck", "straggler", "rank_crashed"} <= kinds
    assert sum(c.label.healthy and "phases" in c.config.get("demo", {}) for c in quick) >= 4


def test_the_set_holds_sixty_cases_a_third_healthy_and_those_no_tool_was_shaped_to() -> None:
    cases = {c.name: c for c in load_cases()}
    assert len(cases) >= 60 and 3 * sum(c.label.healthy for c in cases.values()) >= len(cases)
    unshaped = ["livelock", "eval_alone", "child_checkpoint", "loader_work", "child_blocked",
                "storage_dead", "retry_flood", "own_deadlock", "async_checkpoint",
                "compile_first_step", "chatty_eval", "storage_failover"]  # fmt: skip
    assert all(any(kind in name for name in cases) for kind in unshaped)
    dead = cases["demo-storage_dead-late"]
    assert dead.storage == {"freeze_at_mb": 9} and dead.label.culprit_ranks == (0, 1, 2, 3)
    areal = [c for name, c in cases.items() if name.startswith("areal-")]
    kinds = {c.label.kind for c in areal}
    assert {"inference_unreachable", "inference_paused", "cleanup_deadlock", ""} <= kinds
    assert all("areal" in c.needs for c in areal)
    assert not cases["areal-healthy"].torchrun_ranks and cases["areal-early_break"].torchrun_ranks
    assert cases["areal-early_break"].areal_harness == ("--train-raise-from", "2")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("title: t\nbase: examples/hang_demo/config.yaml\n", "label must be a mapping"),
        ("title: t\nbase: nowhere.yaml\nlabel: {healthy: true}\n", "base: "),
        ("base: examples/hang_demo/config.yaml\nlabel: {healthy: true}\n", "title is missing"),
        (
            "title: t\nbase: examples/hang_demo/config.yaml\nlabel: {healthy: false, kind: x}\n",
            "label.culprit_ranks is missing",
        ),
        (
            "title: t\nbase: examples/hang_demo/config.yaml\nneeds: [gpus]\n"
            "label: {healthy: true}\n",
            "needs: ['gpus'] unknown",
        ),
        (
            "title: t\nbase: examples/hang_demo/config.yaml\nquick: yes please\n"
            "label: {healthy: true}\n",
            "quick: 'yes please' is not a bool",
        ),
        (
            "title: t\nbase: examples/hang_demo/config.yaml\nstorage: {freeze_at_mb: 3}\n"
            "label: {healthy: true}\n",
            "storage needs a FUSE mount; add needs: [fuse]",
        ),
    ],
)
def test_a_broken_case_fails_in_one_line_naming_file_and_key(
    tmp_path: Path, body: str, message: str
) -> None:
    (tmp_path / "case.yaml").write_text(body)
    with pytest.raises(CaseError) as error:
        load_case(tmp_path)
    assert message in str(error.value) and str(tmp_path / "case.yaml") in str(error.value)
    assert "\n" not in str(error.value)


def test_the_slurm_cases_span_nodes_a_lost_one_a_straggling_one_and_a_slow_healthy_one() -> None:
    on_slurm = [c for c in load_cases() if "slurm" in c.needs]
    assert all(c.config["cluster"]["n_nodes"] >= 2 for c in on_slurm)
    kinds = {c.label.kind for c in on_slurm if not c.label.healthy}
    assert kinds == {"node_lost", "straggler"} and any(c.label.healthy for c in on_slurm)


def test_the_watchdog_row_keeps_what_the_case_says_of_its_machine() -> None:
    """The silent GPU evaluation is healthy only with its recorded GPU at work: the row adds
    its webhook to the case's ``watchdog`` section, never in its place."""
    case = load_case(CASES / "demo-gpu_eval")
    launch = Launch(config=copy.deepcopy(case.config))
    AreaLWatchdog(receiver=None).prepare(case, launch)  # type: ignore[arg-type]
    watchdog = launch.config["watchdog"]
    assert watchdog["gpu"]["backend"] == "recorded" and watchdog["notify"][0]["type"] == "webhook"
