"""A run directory nobody else can plant anything in, and one launch at a time in it. What users
see: the directories created private, and a one-line refusal that names the unsafe directory
(or the launcher that holds the run) and the fix."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from areal_watchdog.common.errors import UserError
from areal_watchdog.rundir.lock import hold_run_lock
from areal_watchdog.rundir.secure import (
    check_ancestors,
    check_run_dir,
    ensure_run_dir,
    private_dir_problem,
    run_dir_owner,
)

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away needs root")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def refusal(excinfo: pytest.ExceptionInfo[UserError]) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_the_launcher_creates_the_run_directory_private(tmp_path: Path) -> None:
    fileroot = tmp_path / "root"
    run_dir = fileroot / "exp" / "trial"
    ensure_run_dir(run_dir, fileroot, mode=0o750)
    assert mode(fileroot / "exp") == 0o755
    assert mode(run_dir) == 0o750
    assert mode(run_dir / "watchdog") == 0o750
    ensure_run_dir(run_dir, fileroot, mode=0o750)  # a relaunch into it is fine
    assert private_dir_problem(run_dir / "watchdog") == "mode 750, not 700"


def test_a_run_directory_others_may_write_to_is_refused_with_the_fix(tmp_path: Path) -> None:
    run_dir = tmp_path / "exp" / "trial"
    run_dir.mkdir(parents=True)
    run_dir.chmod(0o777)
    with pytest.raises(UserError) as excinfo:
        ensure_run_dir(run_dir, tmp_path)
    message = refusal(excinfo)
    assert message.startswith(f"{run_dir}: writable by group or others (mode 777)")
    assert f"chmod go-w {run_dir}" in message and "trial_name" in message


def test_a_planted_symlink_is_never_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "trial").symlink_to(elsewhere)
    with pytest.raises(UserError) as excinfo:
        ensure_run_dir(tmp_path / "exp" / "trial", tmp_path)
    assert "not a plain directory (a symlink?)" in refusal(excinfo)
    assert not (elsewhere / "watchdog").exists()
    assert private_dir_problem(tmp_path / "exp" / "trial") == "not a plain directory (a symlink?)"


def test_a_shared_folder_above_the_fileroot_must_be_sticky(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UserError) as excinfo:
        check_ancestors(shared / "fileroot")
    message = refusal(excinfo)
    assert message.startswith(f"{shared}: writable by others and not sticky")
    assert message.endswith("choose another cluster.fileroot")
    shared.chmod(0o1777)  # like /tmp: others cannot replace what is ours there
    check_ancestors(shared / "fileroot")


@as_root
def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "exp" / "trial"
    run_dir.mkdir(parents=True, mode=0o700)
    os.chown(run_dir, 4242, -1)
    with pytest.raises(UserError) as excinfo:
        ensure_run_dir(run_dir, tmp_path)
    assert f"{run_dir}: owned by uid 4242, not by you" in refusal(excinfo)
    assert private_dir_problem(run_dir) == "owned by uid 4242, not by you"
    assert run_dir_owner(run_dir) == 4242  # whose processes and logs count


def test_a_command_reads_a_run_directory_only_we_could_have_written(tmp_path: Path) -> None:
    run_dir = tmp_path / "exp" / "trial"
    ensure_run_dir(run_dir, tmp_path)
    (tmp_path / "link").symlink_to(run_dir)
    assert check_run_dir(tmp_path / "link") == run_dir.resolve()
    (run_dir / "watchdog").chmod(0o777)
    with pytest.raises(UserError) as excinfo:
        check_run_dir(run_dir)
    assert "run this command as the user who launched the run" in refusal(excinfo)
    with pytest.raises(UserError) as excinfo:
        check_run_dir(tmp_path / "no-such-run")
    assert refusal(excinfo) == (
        f"{tmp_path / 'no-such-run'}: cannot read the run directory: No such file or directory"
    )


def test_a_second_launch_into_a_run_in_use_is_refused_naming_the_holder(tmp_path: Path) -> None:
    watch_dir = tmp_path / "trial" / "watchdog"
    watch_dir.mkdir(parents=True)
    held = hold_run_lock(watch_dir)
    try:
        with pytest.raises(UserError) as excinfo:
            hold_run_lock(watch_dir)
        message = refusal(excinfo)
        assert message.startswith(f"{tmp_path / 'trial'}: already in use by areal-launch pid ")
        assert f"pid {os.getpid()} (since " in message
        assert message.endswith("wait for it to end or choose another trial_name")
    finally:
        os.close(held)
    again = hold_run_lock(watch_dir)  # the holder gone (even by kill -9), the run is free
    os.close(again)
    assert mode(watch_dir / "launch.lock") == 0o600
