# --- areal-watchdog (rendered from areal_watchdog/launch/slurm/templates/slurm_setup.sh) ---
# Runs in the batch shell on the first node, before submitit's srun starts one task per node.
export AREAL_WATCHDOG_RUN_DIR=${run_dir}
mkdir -p ${logs_dir}
# An srun that Slurm's controller did not answer (busy, restarting: "Unable to confirm
# allocation ... Socket timed out") launched nothing, and would fail the job that just started:
# every srun of this script (the sidecars', submitit's) tries again every ${srun_retry_seconds} s,
# for up to ${controller_patience} s. Any other failure is the step's own, and stands.
srun() {
  local areal_said areal_status areal_deadline=$$((SECONDS + ${controller_patience}))
  areal_said=$$(mktemp)
  while :; do
    : > "$$areal_said"
    {  # srun's own messages to the log and, through a pipe that ends with srun, to a copy
      command srun "$$@" 2>&1 1>&3 3>&- | tee -a "$$areal_said" >&2 3>&-
      areal_status=$${PIPESTATUS[0]}
    } 3>&1
    if [ $$areal_status -eq 0 ] || [ $$SECONDS -ge $$areal_deadline ] ||
      ! grep -qE '${controller_silent}' "$$areal_said"; then
      break
    fi
    echo "areal-watchdog: Slurm's controller did not answer srun; trying again in ${srun_retry_seconds} s" >&2
    sleep ${srun_retry_seconds}
  done
  rm -f "$$areal_said"
  return $$areal_status
}
# One watchdog sidecar per node, all in one overlapping step beside the job's step: one srun,
# not one per node (a thousand steps at once would load slurmctld). A task that dies ends no
# other (--kill-on-bad-exit=0), nor does a node that fails (--no-kill). Task counts are
# explicit: the batch environment's SLURM_NTASKS* would leak into this srun otherwise.
${sidecar_step} &
