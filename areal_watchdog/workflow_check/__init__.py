"""``areal-launch check-workflow CONFIG``: AReaL's debugging guide's workflow procedure as one
command. The job's own training script runs up to ``PPOTrainer.train`` in ``launch.python``
(``probe``), and the workflow and reward it names then run against a persistent inference
server in the guide's order: one episode, one batch at the training's concurrency, and the same
batch through AReaL's rollout engine with the config's staleness settings (``stages``). The
launcher side (``command``) finds or starts the server (``server``) and prints one table
(``render``); the records between the two are ``model``'s."""
