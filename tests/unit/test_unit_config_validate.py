"""A resolved config tree checked before anything starts. What users see: a JobConfig with the
documented defaults, or one line ``<file>: `<key>`: <what is wrong and the fix>`` naming the
first bad key (a typo in our sections gets the closest known key)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest

from areal_watchdog.common.errors import ConfigError
from areal_watchdog.config.debug_env import DEFAULT_DEBUG_ENV
from areal_watchdog.config.model import HangAction, WatchdogSection
from areal_watchdog.config.reading.checks import Checker, default
from areal_watchdog.config.validate import validate

SOURCE = "/jobs/config.yaml"


def tree(tmp_path: Path, **sections: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "experiment_name": "exp",
        "trial_name": "t1",
        "cluster": {"fileroot": str(tmp_path / "root")},
        "launch": {"entrypoint": "train.py", "python": sys.executable},
    }
    for name, value in sections.items():
        raw[name] = {**raw.get(name, {}), **value} if isinstance(value, dict) else value
    return raw


def refusal(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as excinfo:
        validate(SOURCE, raw)
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_a_minimal_config_gets_the_documented_defaults(tmp_path: Path) -> None:
    config = validate(SOURCE, tree(tmp_path))
    assert (config.experiment_name, config.trial_name, config.n_nodes) == ("exp", "t1", 1)
    assert config.launch.nproc_per_node == 1 and config.launch.run_dir_mode == 0o700
    assert config.watchdog.on_hang is HangAction.REPORT
    assert config.watchdog.stall_timeout is None  # auto: learned from the step intervals
    assert config.watchdog.debug_env == DEFAULT_DEBUG_ENV


def test_watchdog_values_reach_the_job_config(tmp_path: Path) -> None:
    watchdog = {
        "on_hang": "resume",
        "stall_timeout": "auto",
        "poll_interval": 0.25,
        "debug_env": {"NCCL_DEBUG": "INFO", "PYTHONFAULTHANDLER": None, "MY_FLAG": 1},
        "resume": {"max_attempts": "2"},
    }
    config = validate(SOURCE, tree(tmp_path, watchdog=watchdog, cluster={"n_gpus_per_node": 4}))
    assert config.watchdog.on_hang is HangAction.RESUME
    assert config.watchdog.stall_timeout is None  # auto
    assert config.watchdog.poll_interval == 0.25
    assert config.watchdog.resume.max_attempts == 2
    assert config.launch.nproc_per_node == 4  # one rank per GPU unless told
    env = config.watchdog.debug_env
    assert env["NCCL_DEBUG"] == "INFO" and env["MY_FLAG"] == "1"
    assert "PYTHONFAULTHANDLER" not in env  # null switches a default off
    assert DEFAULT_DEBUG_ENV["PYTHONFAULTHANDLER"] == "1"  # the default itself untouched


def test_a_misspelt_watchdog_key_names_the_file_the_key_and_the_closest_one(
    tmp_path: Path,
) -> None:
    message = refusal(tree(tmp_path, watchdog={"stall_timout": 30}))
    assert message == (
        f"{SOURCE}: `watchdog.stall_timout`: unknown key (did you mean stall_timeout?)"
    )
    message = refusal(tree(tmp_path, watchdog={"gpu": {"zzz": 1}}))
    assert message.startswith(f"{SOURCE}: `watchdog.gpu.zzz`: unknown key; known: backend, ")


def test_a_bad_on_hang_lists_the_actions(tmp_path: Path) -> None:
    assert refusal(tree(tmp_path, watchdog={"on_hang": "kill"})) == (
        f"{SOURCE}: `watchdog.on_hang`: must be one of report, cancel, resume; got 'kill'"
    )


@pytest.mark.parametrize(
    ("sections", "key", "says"),
    [
        ({"trial_name": "my-trial"}, "trial_name", "may not contain '-'"),
        ({"experiment_name": "../up"}, "experiment_name", "is not a name"),
        ({"launch": {"entrypoint": None}}, "launch.entrypoint", "is missing"),
        ({"launch": {"python": "/no/python"}}, "launch.python", "not an executable"),
        ({"launch": {"nproc_per_node": 0}}, "launch.nproc_per_node", "must be at least 1"),
        ({"launch": {"run_dir_mode": "0777"}}, "launch.run_dir_mode", "no write for others"),
        ({"launch": {"ray": {"address": "head:8265"}}}, "launch.ray.address", "Jobs API's URL"),
        ({"watchdog": {"stall_timeout": 0}}, "watchdog.stall_timeout", "must be positive"),
        ({"watchdog": {"poll_interval": True}}, "watchdog.poll_interval", "must be a number"),
        ({"watchdog": {"step_regex": "step \\d+"}}, "watchdog.step_regex", "needs a group"),
        ({"watchdog": {"step_regex": "step (\\d+"}}, "watchdog.step_regex", "not a valid"),
        ({"watchdog": {"enabled": "yes"}}, "watchdog.enabled", "must be true or false"),
        ({"watchdog": {"gpu": {"backend": "recorded"}}}, "watchdog.gpu.recording", "is missing"),
        ({"cluster": {"n_nodes": "two"}}, "cluster.n_nodes", "must be a whole number"),
        ({"watchdog": {"notify": [{"type": "webhook", "url_env": ""}]}},
         "watchdog.notify[0].url_env", "must name a variable"),
    ],
)  # fmt: skip
def test_a_bad_value_names_its_key(
    tmp_path: Path, sections: dict[str, Any], key: str, says: str
) -> None:
    message = refusal(tree(tmp_path, **copy.deepcopy(sections)))
    assert message.startswith(f"{SOURCE}: `{key}`: ")
    assert says in message


def test_a_fileroot_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "root").write_text("")
    message = refusal(tree(tmp_path))
    assert message == f"{SOURCE}: `cluster.fileroot`: {tmp_path / 'root'} is not a directory"


def test_typed_reads_refuse_what_is_not_a_value_of_the_type() -> None:
    check = Checker("c.yaml")
    assert check.integer({"n": " 8 "}, "a.n", 1, minimum=1) == 8  # a quoted number is fine
    assert check.string_list({"args": "--fast"}, "a.args") == ["--fast"]
    with pytest.raises(ConfigError, match=r"`a.t`: must be a finite number, got nan"):
        check.number({"t": float("nan")}, "a.t", 1.0, minimum=0.0)
    with pytest.raises(ConfigError, match=r"`a.n`: must be at most 4, got 5"):
        check.integer({"n": 5}, "a.n", 1, minimum=1, maximum=4)
    with pytest.raises(ConfigError, match=r"`a.s`: must be a mapping, got list"):
        check.section({"s": [1]}, "a.s")


def test_a_default_is_read_from_the_dataclass_and_never_shared() -> None:
    assert default(WatchdogSection, "poll_interval") == 1.0
    first = default(WatchdogSection, "notify")
    first.append({"type": "webhook"})
    assert default(WatchdogSection, "notify") == []


def test_a_name_ending_in_a_newline_is_refused(tmp_path: Path) -> None:
    assert "is not a name" in refusal(tree(tmp_path, trial_name="t1\n"))


def test_a_digit_like_character_is_a_config_error_not_a_traceback() -> None:
    with pytest.raises(ConfigError, match="must be a whole number"):
        Checker("c.yaml").integer({"n": "²"}, "a.n", 1, minimum=0)
