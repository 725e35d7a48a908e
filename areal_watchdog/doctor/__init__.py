"""``areal-launch doctor``: can the watchdog take its evidence on this node (or on every node of
a Slurm allocation) before a long job starts? One module per group of checks, each returning
plain ``Check`` records; ``command`` runs them and ``render`` prints one table."""
