# --- areal-watchdog (rendered from areal_watchdog/launch/slurm/templates/slurm_teardown_same_allocation.sh) ---
# The job step ended. As in slurm_teardown.sh, the leading sidecar gets up to ${conclude_seconds} s
# to conclude. With watchdog.resume.allocation: same, a step the watchdog ended after a hang is
# not the job's end: this script keeps the allocation and waits for areal-launch's decision
# (it replays the hung step on a node of this allocation first), then starts the sidecars and
# the job's step again, or ends. The job's state stays the last step's.
areal_step_status=$$?
areal_conclude() {
  for areal_wait in $$(seq 1 $$((${conclude_seconds} * 2))); do
    [ -e ${finished_file} ] || [ -e ${cancel_file} ] && break
    sleep 0.5
  done
}
areal_conclude
while ${container_prefix}${python} -m areal_watchdog.launch.slurm.control.same_allocation ${run_dir}; do
  ${sidecar_step} &
  ${job_step}
  areal_step_status=$$?
  areal_conclude
done
exit $$areal_step_status
