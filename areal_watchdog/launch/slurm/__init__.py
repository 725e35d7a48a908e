"""The Slurm backend: plan, submission through submitit, job state, and the per-node task."""
