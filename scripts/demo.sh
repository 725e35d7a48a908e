#!/usr/bin/env bash
# Set up, then run the main demo: a real 4-rank torchrun job on gloo that hangs (rank 2 calls a
# different collective at step 4); the watchdog catches it, explains it and cancels the job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
set +e
areal-launch --watchdog local examples/hang_demo/config.yaml "$@"
code=$?
set -e
report=$(ls -t /tmp/areal-watchdog-demo/hang-demo/*/incidents/*/report.md 2>/dev/null | head -n 1)
if [ "$code" -ne 3 ] || [ -z "$report" ]; then
  echo "[demo] expected a hang report and exit code 3, got exit code $code" >&2
  exit 1
fi
echo
echo "================ $report ================"
cat "$report"
