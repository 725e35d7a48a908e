"""``areal-launch check-consistency RUN_DIR``: the engine's log-probs of the trained tokens beside
the trainer's (``check_consistency``), the numbers (``consistency``), their picture
(``consistency_plot``), the trainer's recomputation (``recompute``) and greedy generation on the
run's own prompts (``greedy``). What that check computes or shows belongs here."""
