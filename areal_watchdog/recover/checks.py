"""What a launch with ``on_hang: resume`` is checked for and told before anything runs: whether
the job can be resumed at all (one-line errors), whether its rows could be named, and what
``--dry-run`` says a resume would do. The resume itself is ``resume``."""

from __future__ import annotations

from areal_watchdog.common.errors import UserError
from areal_watchdog.config.model import HangAction, JobConfig
from areal_watchdog.launch.recovery import Recovery
from areal_watchdog.trajectory.quarantine import ENV_QUARANTINE

ENV_ATTEMPT = "AREAL_WATCHDOG_RESUME_ATTEMPT"  # 1 on the first resume, 2 on the next, ...
ENV_LAST_STEP = "AREAL_WATCHDOG_RESUME_LAST_STEP"  # the last step seen before the hang
AREAL_RECOVER_MODES = ("on", "auto")


def check_resumable(config: JobConfig, recovery: Recovery, mode: str) -> None:
    """Refuse, in one line, a resume this backend cannot do, or one that would start an AReaL
    job from its first step."""
    if config.watchdog.on_hang is not HangAction.RESUME:
        return
    refusal = recovery.refusal(config, mode)
    if refusal:
        raise UserError(f"{config.source}: {refusal}")
    if mode == "torchrun":
        return
    recover = config.raw.get("recover") if isinstance(config.raw.get("recover"), dict) else {}
    if recover.get("mode") is True:  # YAML 1.1 reads an unquoted `on` as true
        raise UserError(
            f"{config.source}: recover.mode: YAML reads an unquoted on as true: write "
            'recover.mode: "on" (or auto)'
        )
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
    if mode != "torchrun" or not config.watchdog.trajectory.enabled:
        return None
    if config.raw.get("tokenizer_path"):
        return None
    return (
        f"{config.source}: tokenizer_path: watchdog.on_hang: resume names the rows of a hang "
        "that follows the data by their prompts, decoded with the run's tokenizer, and this "
        "config has none: set tokenizer_path to a local tokenizer directory (a script that "
        "does not record its steps can ignore this)"
    )


def resume_notes(config: JobConfig, mode: str, recovery: Recovery) -> list[str]:
    """What ``--dry-run`` says a resume would run."""
    wd = config.watchdog
    waits = ", ".join(f"{wd.resume.backoff * 2**n:g} s" for n in range(wd.resume.max_attempts))
    where, resumed_where = recovery.dry_run(config, mode)
    start = (
        "AReaL's recover checkpoint of the trial (recover.mode: auto)"
        if mode != "torchrun"
        else "the script's own checkpoint"
    )
    return [
        f"on a hang (watchdog.on_hang: resume): the report first, then the job is ended; the "
        f"hung step, when dumped, is replayed {where} (at most {wd.resume.max_replays} "
        "replays, bisecting a batch that hangs the same way; its hanging rows go to "
        "quarantine.json and out of the resumed run);",
        f"then this plan runs again from {start}, up to {wd.resume.max_attempts} time(s) "
        f"(after {waits}), with",
        f"  {ENV_ATTEMPT}=<1, 2, ...>",
        f"  {ENV_LAST_STEP}=<the last step seen before the hang>",
        f"  {ENV_QUARANTINE}=<RUN_DIR/quarantine.json, once rows are quarantined>",
        *resumed_where,
        "  and stops when the same hang comes back at the same step (docs/recovery.md)",
    ]  # fmt: skip
