# --- areal-watchdog (rendered from areal_watchdog/launch/slurm/templates/slurm_setup.sh) ---
# Runs in the batch shell on the first node, before submitit's srun starts one task per node.
export AREAL_WATCHDOG_RUN_DIR=${run_dir}
mkdir -p ${logs_dir}
# One watchdog sidecar per node, each an overlapping step of its own beside the job's step, so
# that losing one node never takes the other nodes' sidecars with it. Task counts are explicit:
# the batch environment's SLURM_NTASKS* would leak into these sruns otherwise.
for areal_node in $$(scontrol show hostnames "$$SLURM_JOB_NODELIST"); do
  srun --overlap --nodes=1 --ntasks=1 --ntasks-per-node=1 --nodelist="$$areal_node" \
    --kill-on-bad-exit=0 --output=${logs_dir}/sidecar_$${areal_node}.out --open-mode=append \
    ${sidecar_srun_args}${container_prefix}${python} -m areal_watchdog.watch.sidecar \
    --run-dir ${run_dir} --node-from-slurm &
done
