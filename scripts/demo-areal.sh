#!/usr/bin/env bash
# The AReaL demo: a real AReaL 1.0 GRPO experiment on this CPU (AReaL's own trainer, scheduler,
# rpc_server workers and rollout machinery; a tiny model made offline and an SGLang stand-in),
# watched by areal-launch. At step 5 a poisoned dataset row makes the workflow's calculator tool
# hang; the watchdog names the rollout worker that holds the stuck episodes, cancels the job and
# shows the report. Runs in a loopback-only network namespace (needs root; docs/areal.md).
#
#   bash scripts/demo-areal.sh [launch.mode=spmd] [key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --areal
export PATH="$PWD/.venv/bin:$PATH"
FILEROOT=/tmp/areal-watchdog-demo/areal
echo "[demo] making the tiny model, tokenizer and dataset in $FILEROOT/harness"
python examples/areal/harness/make_tiny.py "$FILEROOT/harness" --poison-from 8 >/dev/null 2>&1
set +e
bash scripts/loopback.sh areal-launch --watchdog local examples/areal/gsm8k_grpo.yaml "$@"
code=$?
set -e
report=$(ls -t "$FILEROOT"/gsm8k-grpo/*/incidents/*/report.md 2>/dev/null | head -n 1)
if [ "$code" -ne 3 ] || [ -z "$report" ]; then
  echo "[demo] expected a hang report and exit code 3, got exit code $code" >&2
  exit 1
fi
echo
echo "================ $report ================"
cat "$report"
