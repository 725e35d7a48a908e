"""What a launch with ``on_hang: resume`` is checked for and told before anything runs: whether
the job can be resumed at all (one-line errors), whether its rows could be named, and what
``--dry-run`` says a resume would do. The resume itself is ``resume``."""

from __future__ import annotations

from areal_watchdog.common.errors import UserError
from areal_watchdog.config.model import HangAction, JobConfig
from areal_watchdog.launch.slurm.replay import NEW_ALLOCATION
from areal_watchdog.trajectory.quarantine import ENV_QUARANTINE

ENV_ATTEMPT = "AREAL_WATCHDOG_RESUME_ATTEMPT"  # 1 on the first resume, 2 on the next, ...
ENV_LAST_STEP = "AREAL_WATCHDOG_RESUME_LAST_STEP"  # the last step seen before the hang
AREAL_RECOVER_MODES = ("on", "auto")
_SLURM_RESUME = {  # where a resume runs on Slurm, by launch mode (or resume.allocation)
    "torchrun": "in a new allocation (--exclude) without the nodes a transient hang named",
    "spmd": "in a new allocation (--exclude) without the nodes a transient hang named",
    "single_controller": "AReaL's jobs submitted again (their scheduling_spec's exclude) "
    "without the nodes a transient hang named",
    "same": "as a new step of the same allocation (watchdog.resume.allocation: same), on its "
    "nodes: a node a hang named is not left out",
}  # AReaL's modes that load the trial's recover checkpoint


def check_resumable(config: JobConfig, backend: str, mode: str, wait: bool = True) -> None:
    """Refuse, in one line, a resume this release cannot do yet, or one that would start an
    AReaL job from its first step."""
    if config.watchdog.on_hang is not HangAction.RESUME:
        return
    if backend == "ray":
        raise UserError(
            f"{config.source}: watchdog.on_hang: resume is not on the ray backend yet; use "
            "on_hang: cancel (or report) there"
        )
    if (
        backend == "slurm"
        and mode == "single_controller"
        and config.watchdog.resume_allocation == "same"
    ):
        raise UserError(
            f"{config.source}: watchdog.resume.allocation: same keeps a Slurm job's allocation, "
            "but AReaL's single controller submits its own jobs: use allocation: new"
        )
    if backend == "slurm" and mode != "single_controller" and not wait:
        raise UserError(
            f"{config.source}: watchdog.on_hang: resume on Slurm follows the job from this "
            "shell: add --wait"
        )
    if mode == "torchrun":
        return
    recover = config.raw.get("recover") if isinstance(config.raw.get("recover"), dict) else {}
    if recover.get("mode") not in AREAL_RECOVER_MODES or not (
        recover.get("freq_steps") or recover.get("freq_epochs")
    ):
        raise UserError(
            f"{config.source}: recover: watchdog.on_hang: resume restarts an AReaL job from its "
            f"recover checkpoint, which this config never writes (recover.mode "
            f"{recover.get('mode')!r}, freq_steps {recover.get('freq_steps')!r}): set "
            "recover.mode: auto and recover.freq_steps: 1"
        )


def tokenizer_warning(config: JobConfig, mode: str) -> str | None:
    """One line when a torchrun job may dump its steps but names no tokenizer: a hang that
    follows its data could then not name its rows, and the resumes would stop there."""
    if mode != "torchrun" or not config.watchdog.trajectory_dump:
        return None
    if config.raw.get("tokenizer_path"):
        return None
    return (
        f"{config.source}: tokenizer_path: watchdog.on_hang: resume names the rows of a hang "
        "that follows the data by their prompts, decoded with the run's tokenizer, and this "
        "config has none: set tokenizer_path to a local tokenizer directory (a script that "
        "does not record its steps can ignore this)"
    )


def resume_notes(config: JobConfig, mode: str, backend: str = "local") -> list[str]:
    """What ``--dry-run`` says a resume would run."""
    wd = config.watchdog
    waits = ", ".join(f"{wd.resume_backoff * 2**n:g} s" for n in range(wd.resume_max_attempts))
    same = backend == "slurm" and wd.resume_allocation == "same"
    where = "on this node"
    if backend == "slurm":
        where = f"{NEW_ALLOCATION} the hangs did not name"
    if same:
        where = "on a node of the job's allocation the hangs did not name (else " + where + ")"
    slurm_resume = _SLURM_RESUME["same" if same else mode]
    start = (
        "AReaL's recover checkpoint of the trial (recover.mode: auto)"
        if mode != "torchrun"
        else "the script's own checkpoint"
    )
    return [
        f"on a hang (watchdog.on_hang: resume): the report first, then the job is ended; the "
        f"hung step, when dumped, is replayed {where} (at most {wd.resume_max_replays} "
        "replays, bisecting a batch that hangs the same way; its hanging rows go to "
        "quarantine.json and out of the resumed run);",
        f"then this plan runs again from {start}, up to {wd.resume_max_attempts} time(s) "
        f"(after {waits}), with",
        f"  {ENV_ATTEMPT}=<1, 2, ...>",
        f"  {ENV_LAST_STEP}=<the last step seen before the hang>",
        f"  {ENV_QUARANTINE}=<RUN_DIR/quarantine.json, once rows are quarantined>",
        *([f"  {slurm_resume}"] if backend == "slurm" else []),
        "  and stops when the same hang comes back at the same step (docs/recovery.md)",
    ]  # fmt: skip
