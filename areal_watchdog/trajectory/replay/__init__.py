"""``areal-launch replay RUN_DIR``: the plan that runs the same entrypoint fed from the dump
(``replay_plan``) and what an AReaL experiment's replay changes in its config (``areal_replay``).
What a replay needs beyond reading the dump (``trajectory.reader``) belongs here."""
