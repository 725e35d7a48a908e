"""What every backend plans the same way, before anything runs: the plan as plain data (``plan``),
the ranks' environment, command and files (``job``), the one torchrun command line (``torchrun``),
AReaL's own launch modes (``areal``) and the wait for AReaL's servers (``gate``). A backend turns
these into its own plan; a change to what every launch starts belongs here."""
