"""``on_hang: resume``: after the report the job is ended and started again from its own
checkpoint; a transient hang trains on to the end, a hang that comes back at the same step
stops the resumes, and both say so on the terminal, in the reports and in ``status``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from areal_watchdog.recover.policy import Hang, decide
from conftest import FAST, REPO
from testkit.launcher import DEMO_CONFIG, Launcher
from testkit.receiver import Receiver
from testkit.standins import ROUTING_KEY, StandIn

RESUME = [
    *FAST,
    "watchdog.on_hang=resume",
    "+watchdog.resume.backoff=1",
    "watchdog.startup_timeout=45",  # a slow start under load is no stall
    "demo.steps=8",
    "demo.hang_step=4",
]
SECRET = "resume-signing-secret"
SLACK_TOKEN = "xoxb-resume-test-bot-token"


def notify(slack_api: str, pagerduty_api: str) -> str:
    """A signed webhook, a Slack bot (a token and a channel: replies go in the thread) and
    PagerDuty."""
    return (
        "+watchdog.notify=[{type: webhook, url_env: HOOK_URL, secret_env: HOOK_SECRET},"
        f" {{type: slack, token_env: SLACK_TOKEN, channel: C0ALERTS, api_url: '{slack_api}'}},"
        f" {{type: pagerduty, routing_key_env: PD_KEY, api_url: '{pagerduty_api}'}}]"
    )


def hang(category: str, step: int | None, where: str = "train.py:90 in announce_metrics") -> Hang:
    return Hang("i", category, step, "culprit ranks 2", (where,))


def test_a_hang_that_comes_back_at_the_same_step_stops_the_resumes() -> None:
    first = decide([hang("collective_mismatch", 3)], max_attempts=3, backoff=10)
    assert (first.resume, first.backoff_s) == (True, 10)
    again = decide([hang("collective_mismatch", 3)] * 2, max_attempts=3, backoff=10)
    assert not again.resume
    said = "the same hang came back after a resume: collective_mismatch (culprit ranks 2 at"
    assert said in again.reason
    elsewhere = [hang("collective_mismatch", 3), hang("collective_mismatch", 7)]
    later = decide(elsewhere, max_attempts=3, backoff=10)
    assert (later.resume, later.backoff_s) == (True, 20)  # doubled
    spent = decide([hang("straggler", n) for n in (1, 2, 3, 4)], max_attempts=3, backoff=10)
    assert not spent.resume and "3 resume(s) spent" in spent.reason


def test_a_spinning_culprit_sampled_on_another_line_hangs_the_same_way() -> None:
    first = hang("straggler", 2, "at modeling_tiny.py:32 in restart_positions()")
    again = hang("straggler", 2, "at modeling_tiny.py:31 in restart_positions()")
    elsewhere = hang("straggler", 2, "at modeling_tiny.py:31 in forward()")
    assert first.same_as(again) and not first.like(elsewhere)


def test_an_unknown_hang_is_never_the_same_as_another() -> None:
    unknown = Hang.from_report(None, None, resumed_after=3)
    assert decide([unknown, unknown], max_attempts=3, backoff=0).resume


def status(run_dir: Path) -> str:
    return subprocess.run(
        [sys.executable, "-m", "areal_watchdog.cli", "status", str(run_dir)],
        capture_output=True, text=True, cwd=REPO, check=True,
    ).stdout  # fmt: skip


@pytest.mark.slow
def test_a_transient_hang_is_resumed_from_the_checkpoint_and_the_job_completes(
    launcher: Launcher, tmp_path: Path
) -> None:
    """Rank 2 freezes once (SIGSTOP) at step 4: reported, ended, started again after step 3;
    the webhook hears the decision under the incident's id, Slack in the incident's thread,
    and PagerDuty's page is resolved once the resumed job moves."""
    checkpoint = tmp_path / "ckpt.json"
    receiver, pagerduty = Receiver(SECRET), StandIn("pagerduty", ROUTING_KEY)
    env = {"HOOK_URL": receiver.url("/hook"), "HOOK_SECRET": SECRET, "SLACK_TOKEN": SLACK_TOKEN,
           "PD_KEY": ROUTING_KEY}  # fmt: skip
    sinks = notify(receiver.url("/api/chat.postMessage"), pagerduty.url("/v2/enqueue"))
    try:
        result = launcher.run(
            [*RESUME, sinks, "demo.hang=collective_stuck", "demo.hang_once=true",
             f"demo.checkpoint={checkpoint}"], trial="transient", env=env,
        )  # fmt: skip
    finally:
        receiver.close()
        pagerduty.close()
    assert result.returncode == 0, result.output[-4000:]
    assert "resume 1 of 3 after" in result.output
    assert "ckpt.json: 3 steps done" in result.output  # the script's own checkpoint
    assert "after 1 resume(s) the job completed" in result.output
    (report,) = result.reports
    assert report["action"] == "resume" and report["last_step"] == 3
    assert report["recovery"]["decision"] == "resume" and report["recovery"]["attempt"] == 1
    assert report["recovery"]["time_lost_s"] > 0
    assert "## Recovery" in Path(report["files"]["report_md"]).read_text()
    hooks = [r.json() for r in receiver.requests if r.path == "/hook"]
    assert all(r.verified for r in receiver.requests if r.path == "/hook")
    assert [(h["event_type"], h["incident_id"]) for h in hooks] == [
        ("hang.detected", report["incident_id"]),
        ("hang.recovery", report["incident_id"]),
    ]
    assert hooks[1]["recovery"] == report["recovery"]
    pages = [(e["event_action"], e["dedup_key"]) for e in pagerduty.accepted]
    assert pages == [("trigger", report["incident_id"]), ("resolve", report["incident_id"])]
    assert [s.problems for s in pagerduty.seen] == [[], []]
    slack = [r for r in receiver.requests if r.path == "/api/chat.postMessage"]
    assert {r.headers["Authorization"] for r in slack} == {f"Bearer {SLACK_TOKEN}"}
    posted, reply = (r.json() for r in slack)
    assert posted["channel"] == reply["channel"] == "C0ALERTS" and "thread_ts" not in posted
    first_ts = f"1795600000.{receiver.requests.index(slack[0]) + 1:06d}"  # as Slack answered
    assert reply["thread_ts"] == first_ts
    assert f"resumed after incident {report['incident_id']}" in reply["text"]
    (share,) = [
        r.json() for r in receiver.requests if r.path.endswith("/files.completeUploadExternal")
    ]
    assert (share["channel_id"], share["thread_ts"]) == ("C0ALERTS", first_ts)  # the timeline
    (png,) = [r.body for r in receiver.requests if r.path.startswith("/upload/")]
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) < 1_000_000
    stored = [p.read_bytes() for p in result.run_dir.rglob("*") if p.is_file()]
    assert SLACK_TOKEN not in result.output and not any(SLACK_TOKEN.encode() in b for b in stored)
    shown = status(result.run_dir)
    assert "(local run, no Slurm job)" in shown
    assert "hang 1: " in shown and "step 3: resume, time lost" in shown
    assert "outcome: completed" in shown


@pytest.mark.slow
def test_a_hang_that_follows_the_job_is_resumed_once_then_stopped(launcher: Launcher) -> None:
    """Rank 2 calls broadcast at step 4 every time: the resumed job hangs at the same place."""
    checkpoint = launcher.root / "ckpt.json"
    result = launcher.run(
        [*RESUME, "demo.hang=collective_mismatch", f"demo.checkpoint={checkpoint}"],
        trial="persistent",
    )
    assert result.returncode == 3, result.output[-4000:]
    first, second = result.reports
    assert (first["category"], second["category"]) == ("collective_mismatch",) * 2
    assert first["recovery"]["decision"] == "resume"
    assert second["recovery"]["decision"] == "stop"
    assert "the same hang came back after a resume" in second["recovery"]["reason"]
    assert "ckpt.json: 3 steps done" in result.output
    assert "it follows the job, not the machine" in result.output
    assert "outcome: stopped: the same hang came back" in status(result.run_dir)


def test_dry_run_shows_what_a_resume_runs_and_what_is_refused_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from areal_watchdog.cli import main

    assert main(["--watchdog", "local", str(DEMO_CONFIG), "watchdog.on_hang=resume",
                 "--dry-run"]) == 0  # fmt: skip
    shown = capsys.readouterr().out
    assert "on a hang (watchdog.on_hang: resume)" in shown
    assert "up to 3 time(s) (after 10 s, 20 s, 40 s)" in shown
    assert "AREAL_WATCHDOG_RESUME_ATTEMPT=<1, 2, ...>" in shown
    assert main(["--watchdog", "slurm", str(DEMO_CONFIG), "watchdog.on_hang=resume",
                 "--dry-run"]) == 2  # fmt: skip
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "on Slurm follows the job from this shell: add --wait" in error[0]
    assert main(["--watchdog", "slurm", str(DEMO_CONFIG), "watchdog.on_hang=resume", "--wait",
                 "--dry-run"]) == 0  # fmt: skip
    shown = capsys.readouterr().out
    assert "in a new allocation (--exclude) without the nodes a transient hang named" in shown
    assert "replayed on a node of a one-node Slurm allocation the hangs did not name" in shown
    # The same allocation: the job's steps end after a hang, the batch script waits and runs
    # them again (its teardown lines say so); not for AReaL's single controller.
    same = ["watchdog.on_hang=resume", "+watchdog.resume.allocation=same", "--wait", "--dry-run"]
    assert main(["--watchdog", "slurm", str(DEMO_CONFIG), *same]) == 0
    shown = capsys.readouterr().out
    assert "as a new step of the same allocation (watchdog.resume.allocation: same)" in shown
    assert "slurm_teardown_same_allocation.sh" in shown
    assert "on a node of the job's allocation the hangs did not name" in shown
    # An AReaL job restarts from AReaL's recover checkpoint: a config that never writes one
    # is refused (the example's recover.mode is disabled).
    areal = REPO / "examples" / "areal" / "gsm8k_grpo.yaml"
    assert main(["--watchdog", "local", str(areal), "watchdog.on_hang=resume", "--dry-run"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "set recover.mode: auto and recover.freq_steps: 1" in error[0]
    assert main(["--watchdog", "local", str(areal), "watchdog.on_hang=resume", "recover.mode=auto",
                 "+recover.freq_steps=1", "--dry-run"]) == 0  # fmt: skip
    shown = capsys.readouterr().out
    assert "runs again from AReaL's recover checkpoint of the trial" in shown
    assert "AREAL_WATCHDOG_QUARANTINE=<RUN_DIR/quarantine.json" in shown
    # AReaL's single controller on Slurm: its own scheduler submits the jobs again, told the
    # nodes to leave out through every scheduling spec (no --wait: the controller runs here).
    recover = ["recover.mode=auto", "+recover.freq_steps=1", "+launch.slurm.exclude=node9"]
    assert main(["--watchdog", "slurm", str(areal), "watchdog.on_hang=resume", *recover,
                 "--dry-run"]) == 0  # fmt: skip
    shown = capsys.readouterr().out
    assert "AReaL's jobs submitted again (their scheduling_spec's exclude) without" in shown
    assert "AReaL's jobs exclude node(s) node9 (launch.slurm.exclude)" in shown
    assert main(["--watchdog", "slurm", str(areal), *recover, *same[:2], "--dry-run"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "AReaL's single controller submits its own jobs" in error[0]
    from areal_watchdog.config.load import load_config
    from areal_watchdog.launch.slurm.backend import SlurmBackend

    plan = SlurmBackend().plan(load_config(areal, recover), watchdog=True)
    (tree,) = [yaml.safe_load(text) for path, text in plan.files.items()
               if path.endswith("job_config.yaml")]  # fmt: skip
    assert tree["rollout"]["scheduling_spec"][0]["exclude"] == "node9"  # what AReaL submits
    assert tree["actor"]["scheduling_spec"][0]["exclude"] == "node9"


def test_a_slurm_replay_asks_one_node_the_hangs_did_not_name(tmp_path: Path) -> None:
    """The replay that decides a Slurm resume: srun, one node, the job's partition, time and
    CPUs, every node the hangs named (and the config's own exclusions) left out."""
    from areal_watchdog.config.load import load_config
    from areal_watchdog.launch.slurm.replay import SlurmReplayHost
    from areal_watchdog.trajectory.replay.replay_plan import ReplayRequest

    config = load_config(
        str(DEMO_CONFIG), ["+launch.slurm.partition=gpu", "+launch.slurm.exclude=node9"]
    )
    host = SlurmReplayHost(config, {"node2", "node1"})
    request = ReplayRequest(tmp_path, step=3, overrides=("++watchdog.notify=[]",), groups=(0, 1, 3))
    command = host.command(request)
    at = command.index(config.launch.python)
    srun, replay = command[:at], command[at:]
    assert srun[:3] == ["srun", "--nodes=1", "--ntasks=1"]
    assert {"--partition=gpu", "--exclude=node1,node2,node9", "--cpus-per-task=4"} <= set(srun)
    assert replay[1:5] == ["-m", "areal_watchdog.cli", "replay", str(tmp_path)]
    assert replay[5:] == ["--step", "3", "--groups", "0-1, 3", "++watchdog.notify=[]"]


def test_a_same_allocation_resume_request_hands_the_step_only_the_watchdogs_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resumed step of a kept allocation reads its run id and resume variables from the
    run directory's request: a request for another job is ignored, and of this job's only the
    ``AREAL_WATCHDOG_*`` variables reach the step (never LD_PRELOAD or PATH)."""
    from areal_watchdog.launch.slurm.control.same_allocation import request
    from areal_watchdog.launch.slurm.node import NodeJob, resumed
    from areal_watchdog.rundir.layout import RunLayout

    layout = RunLayout(tmp_path)
    layout.watch_dir.mkdir(parents=True)
    job = NodeJob(str(tmp_path), "run-1", sys.executable, 2, ["train.py"], {"A": "1"}, True)
    env = {"AREAL_WATCHDOG_RESUME_ATTEMPT": "1", "LD_PRELOAD": "/tmp/evil.so", "PATH": "/tmp"}
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    request(layout, "42", "resume", "run-2", env)
    assert resumed(job) == job
    request(layout, "41", "resume", "run-2", env)
    again = resumed(job)
    assert again.run_id == "run-2"
    assert again.env == {
        "A": "1", "AREAL_WATCHDOG_RESUME_ATTEMPT": "1", "AREAL_WATCHDOG_RUN_ID": "run-2"
    }  # fmt: skip
