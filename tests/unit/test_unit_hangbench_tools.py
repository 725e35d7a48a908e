"""HangBench's peer rows as their documentation configures them: ft_launcher learns its timeouts
after the job's first full cycle of phases, its section timeouts come from its example's config
and are waited for, and its log lines of every kind (heartbeat or section) are its signal."""

from __future__ import annotations

from pathlib import Path

from benchmarks.hangbench.cases import load_case
from benchmarks.hangbench.runs import Run
from benchmarks.hangbench.tools import FaultTolerance, TorchTimeout, available, first_cycle

CASES = Path(__file__).resolve().parents[2] / "benchmarks" / "hangbench" / "cases"


def test_ft_learns_after_the_first_full_cycle_of_phases() -> None:
    assert first_cycle(load_case(CASES / "demo-cpu_eval-late")) == 11  # the evaluation at 10
    assert first_cycle(load_case(CASES / "demo-checkpoint-early")) == 5  # warm-up is longer
    assert first_cycle(load_case(CASES / "demo-straggler-late")) == 5  # no phase: the warm-up


def test_each_row_waits_for_its_own_timeout_and_no_other() -> None:
    assert FaultTolerance("sections").reach == 35.0  # out of section 30 s, checked every 5 s
    assert FaultTolerance("heartbeats").reach == 0.0  # learned: the case's limit
    assert TorchTimeout("torch-default", 1800.0, reach=0.0).reach == 0.0


def test_ft_fires_on_a_heartbeat_or_a_section_and_names_the_ranks_within_a_second() -> None:
    case = load_case(CASES / "demo-straggler-late")
    lines = [
        (10.0, "[RankMonServer2@host:2] Section 'step' has been open for 6.02 seconds."),
        (10.4, "[RankMonServer0@host:0] Was out of section for 31.0 seconds. Timeout is 30.00"),
        (12.0, "[RankMonServer1@host:1] Did not get subsequent heartbeat. Waited 1.58 seconds."),
    ]
    run = Run(case, Path("/r"), Path("/r/run"), 0.0, lines, None)
    fired = FaultTolerance("sections").signal(run)
    assert fired is not None and fired.at == 10.0 and fired.culprits == (0, 2)


def test_a_row_whose_package_is_missing_says_how_to_install_it(tmp_path: Path) -> None:
    case = load_case(CASES / "demo-straggler-late")
    ft = FaultTolerance("heartbeats")
    ft.installed = tmp_path / "nvidia_resiliency_ext"
    setup = "not installed: nvidia-resiliency-ext (bash scripts/setup.sh --peers)"
    assert available(ft, case) == setup
    ft.installed.mkdir()
    assert available(ft, case) == ""
    assert available(TorchTimeout("torch-default", 1800.0, reach=0.0), case) == ""


def test_a_torch_row_reads_the_first_error_of_the_ranks_or_of_a_controller(tmp_path: Path) -> None:
    case = load_case(CASES / "demo-straggler-late")
    log = tmp_path / "run" / "logs" / "attempt_0" / "1" / "stderr.log"
    log.parent.mkdir(parents=True)
    log.write_text("HANGBENCH torch_error rank=1 at=160.300 RuntimeError: [gloo] Timed out\n")
    tuned = TorchTimeout("torch-tuned", 60.0, reach=60.0)
    alone = tuned.signal(Run(case, tmp_path, tmp_path / "run", 0.0, [], None))
    assert alone is not None and alone.at == 160.3 and "Timed out" in alone.detail
    closed = "HANGBENCH torch_error rank=0 at=150.000 RuntimeError: Connection closed"
    controller = [(155.0, closed)]
    first = tuned.signal(Run(case, tmp_path, tmp_path / "run", 0.0, controller, None))
    assert first is not None and first.at == 150.0 and "Connection closed" in first.detail
