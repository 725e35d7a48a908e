#!/usr/bin/env bash
# The AReaL demo: a real AReaL 1.0 GRPO experiment on this CPU (AReaL's own trainer, scheduler,
# rpc_server workers and rollout machinery; a tiny model made offline and an SGLang stand-in),
# watched by areal-launch. Runs in a loopback-only network namespace (needs root; docs/areal.md).
#
#   bash scripts/demo-areal.sh [key=value ...]            a training-side hang, then its replay
#   bash scripts/demo-areal.sh --rollout [key=value ...]  a rollout-side hang
#
# Training side (default): at step 3 a dataset row holds a separator that the model's own code
# loops on in the trainer; one of the two FSDP ranks spins, the other waits in an all-gather. The
# watchdog names the spinning rank and cancels the job; then the demo runs the replay command of
# the report, which retrains the dumped step from AReaL's recover checkpoint of the step before,
# with no rollout and no inference server, and hangs the same way.
# Rollout side (--rollout): at step 5 poisoned rows make the workflow's calculator tool hang; the
# watchdog names the rollout worker that holds the stuck episodes (a replay has no rollout, so it
# cannot show this one).
set -euo pipefail
cd "$(dirname "$0")/.."
side=training
if [ "${1:-}" = "--rollout" ]; then
  side=rollout
  shift
fi
bash scripts/setup.sh --areal
export PATH="$PWD/.venv/bin:$PATH"
FILEROOT=/tmp/areal-watchdog-demo/areal
RUNS="$FILEROOT/gsm8k-grpo"
if [ "$side" = training ]; then
  poison=(--train-poison-from 4)
  overrides=(actor.backend=fsdp:d2 +actor.ppo_n_minibatches=2 recover.mode=auto +recover.freq_steps=1)
else
  poison=(--poison-from 8)
  overrides=(+watchdog.cancel_after=60)  # a tool that never returns looks like a slow one
fi
echo "[demo] making the tiny model, tokenizer and dataset in $FILEROOT/harness"
rm -rf "$FILEROOT/harness"
python examples/areal/harness/make_tiny.py "$FILEROOT/harness" "${poison[@]}" >/dev/null 2>&1

# Runs areal-launch in the loopback namespace; prints the newest report under $1 afterwards.
watched() {
  local where=$1 code
  shift
  set +e
  bash scripts/loopback.sh areal-launch "$@"
  code=$?
  set -e
  report=$(ls -t "$where"/*/incidents/*/report.md 2>/dev/null | head -n 1)
  if [ "$code" -ne 3 ] || [ -z "$report" ]; then
    echo "[demo] expected a hang report and exit code 3, got exit code $code" >&2
    exit 1
  fi
  echo
  echo "================ $report ================"
  cat "$report"
}

watched "$RUNS" --watchdog local examples/areal/gsm8k_grpo.yaml "${overrides[@]}" "$@"
[ "$side" = training ] || exit 0
replay=$(grep -m 1 '^areal-launch replay ' "$report")
echo
echo "[demo] running the report's replay command: $replay"
read -r -a replay_args <<<"${replay#areal-launch }"
rm -rf "$RUNS"/*_replay*
watched "$RUNS" "${replay_args[@]}"
echo
echo "[demo] the replay hung as the run did: $(sed -n 3p "$report")"
