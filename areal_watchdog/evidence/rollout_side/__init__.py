"""Evidence of the rollout side of one node: every inference server probed (``servers``), the calls
of the job to them that wait unanswered (``server_calls``), and both gathered with the processes'
pending tasks (``rollout``). What the sidecar reads of inference servers belongs here."""
