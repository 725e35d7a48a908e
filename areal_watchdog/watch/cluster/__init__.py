"""The sidecars of one job together and the scheduler that runs it: statuses published and read
through the run directory, the leader, evidence requests (``coordination``), a status kept moving
during a long poll (``status_keeper``), standby sidecars (``standby``), and the scheduler's recorded
command run with a verb (``scheduler``). What crosses nodes belongs here."""
