# --- areal-watchdog (rendered from areal_watchdog/launch/slurm/templates/slurm_teardown.sh) ---
# The job step ended. Before the batch script (and with it the job and every sidecar) ends, give
# the leading sidecar up to ${conclude_seconds} s to conclude: it writes its last report, if any,
# then finished.json. A node that vanished is only named once the others notice its silence.
# The job's state stays the step's: a step that failed (or never launched) fails the job.
areal_step_status=$$?
for areal_wait in $$(seq 1 $$((${conclude_seconds} * 2))); do
  [ -e ${finished_file} ] && break
  sleep 0.5
done
exit $$areal_step_status
