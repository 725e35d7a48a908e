"""One module per group of the doctor's checks, each returning plain ``Check`` records
(``doctor.model``): AReaL's hooks, the schedulers' clients, the run directory's filesystem, the
Flight Recorder, GPUs, ptrace and notify sinks. A new group of checks belongs here, run from
``doctor.node`` (per node) or ``doctor.command`` (the launching node)."""
