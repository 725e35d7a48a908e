# --- areal-watchdog (rendered from areal_watchdog/launch/slurm/templates/slurm_setup.sh) ---
# Runs in the batch shell on the first node, before submitit's srun starts one task per node.
export AREAL_WATCHDOG_RUN_DIR=${run_dir}
mkdir -p ${logs_dir}
# One watchdog sidecar per node, all in one overlapping step beside the job's step: one srun,
# not one per node (a thousand steps at once would load slurmctld). A task that dies ends no
# other (--kill-on-bad-exit=0), nor does a node that fails (--no-kill). Task counts are
# explicit: the batch environment's SLURM_NTASKS* would leak into this srun otherwise.
${sidecar_step} &
