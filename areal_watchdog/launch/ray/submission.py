"""A Ray launch's own part of its plan (``LaunchPlan.payload``), shared by the backend that
plans it and the run that executes it."""

from __future__ import annotations

from dataclasses import dataclass

from areal_watchdog.launch.ray.cluster import OwnCluster


@dataclass(frozen=True)
class RaySubmission:
    """What execution needs beyond the processes: where the Jobs API is, the own cluster."""

    address: str
    cluster: OwnCluster | None
    submission_id: str
    python: str
