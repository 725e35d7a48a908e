"""What a recovery (``on_hang: resume``, ``recover/``) may ask of a backend: whether it can
resume this job at all, where the hung step replays, which of the nodes a hang named a resumed
launch can leave out, and what it kept between attempts. ``recover/`` asks these and never
tests a backend's name. The answers below are this machine's (the local backend's); a backend
overrides what it does differently (Slurm: ``launch.slurm.recovery``)."""

from __future__ import annotations

from areal_watchdog.config.model import JobConfig
from areal_watchdog.trajectory.replay.replay_plan import ReplayHost


class Recovery:
    """A backend's answers for one machine: nothing kept, no node to leave out, the replay on
    this node."""

    def refusal(self, config: JobConfig, mode: str) -> str | None:
        """Why this backend cannot resume the job (one line after the config's name); None
        when it can."""
        return None

    def replay_host(self, config: JobConfig, avoid: set[str]) -> ReplayHost | None:
        """Where the hung step replays, on none of the ``avoid`` nodes; None: on this node, in
        this process."""
        return None

    def known_nodes(self, named: set[str]) -> set[str]:
        """Of the nodes a hang named, those this backend can place work away from."""
        return set()

    def leaves_out_nodes(self) -> bool:
        """Whether a resumed launch leaves out the nodes a transient hang named."""
        return False

    def without_nodes(self, config: JobConfig, nodes: set[str]) -> JobConfig:
        """``config`` launched on none of ``nodes`` (those ``leaves_out_nodes`` allows)."""
        return config

    def allocation(self) -> str | None:
        """What the next attempt runs in, for the record (``new``, ``same (job 12)``)."""
        return None

    def dry_run(self, config: JobConfig, mode: str) -> tuple[str, list[str]]:
        """For ``--dry-run``: where the hung step replays, and lines on where a resume runs."""
        return "on this node", []
