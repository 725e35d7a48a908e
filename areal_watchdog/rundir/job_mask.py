"""The run's mask: the secrets a run's processes must never print, read from the run's records
(``launch.json``'s notify sinks) and the environment the launcher gave them (``ENV_MASKED``).
The mask itself, which knows nothing of runs, is ``common.secrets.mask``."""

from __future__ import annotations

import os
from collections.abc import Mapping

from areal_watchdog.common.secrets.mask import ENV_MASKED, Mask
from areal_watchdog.config.sinks import SinkSpec, secret_values
from areal_watchdog.rundir.launch_info import LaunchInfo
from areal_watchdog.rundir.layout import RunLayout


def job_mask(layout: RunLayout, env: Mapping[str, str] | None = None) -> Mask:
    """The run's mask: the values of the variables ``ENV_MASKED`` names in ``env`` (default:
    this process's environment) and the notify secrets of ``launch.json``."""
    env = os.environ if env is None else env
    names = [n for n in env.get(ENV_MASKED, "").split(",") if n in env]
    notify = [SinkSpec.from_dict(d) for d in LaunchInfo.load(layout.run_dir).watchdog.notify]
    return Mask([*(env[n] for n in names), *secret_values(notify)])
