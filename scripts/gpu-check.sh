#!/usr/bin/env bash
# The GPU checks of issue 34, at most 8 minutes: `areal-launch doctor`, `check-consistency` on a
# run dumped by the tiny model on the CPU and scored on this node's device (the GPU where there
# is one: the gap is that device's numerics), then, where nvidia-smi or NVML and a CUDA torch are
# present, NVML on real CUDA processes (one stuck in host code with its GPU idle, one spinning a
# CUDA kernel) and py-spy stacks of a CUDA process. Without a GPU it runs the CPU part (doctor,
# check-consistency) and says so; it never fails for want of a GPU.
#
#   bash scripts/gpu-check.sh [CONFIG [overrides]]     # outputs under $OUT, else ./gpu-check-out
#
# Writes doctor.txt, consistency.txt, consistency.json, and with a GPU: nvml_samples.jsonl (the `recorded` GPU backend's format, a
# fixture for tests/data/gpu/), pyspy_idle.json, pyspy_busy.json and summary.json.
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
out="${OUT:-./gpu-check-out}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

echo "[gpu-check] doctor (this node) -> $out/doctor.txt"
timeout 240 "$python" -m areal_watchdog.cli doctor "$@" >"$out/doctor.txt" 2>&1
doctor=$?
cat "$out/doctor.txt"
echo "[gpu-check] doctor exited $doctor"

echo "[gpu-check] check-consistency on this node's device -> $out/consistency.txt"
work="$(mktemp -d)"
harness="$repo/examples/areal/harness"
"$python" "$harness/make_tiny.py" "$work/h" --rows 8 --shape vllm >/dev/null 2>&1
run="$("$python" "$harness/sampled_dump.py" "$work/h/tiny-qwen2" "$work/root" 2>/dev/null)"
timeout 240 "$python" -m areal_watchdog.cli check-consistency "$run" >"$out/consistency.txt" 2>&1
echo "[gpu-check] check-consistency exited $?"
cat "$out/consistency.txt"
timeout 240 "$python" -m areal_watchdog.cli check-consistency "$run" --json >"$out/consistency.json" 2>/dev/null
rm -rf "$work"

if ! { command -v nvidia-smi >/dev/null || "$python" -c "import pynvml; pynvml.nvmlInit()" 2>/dev/null; }; then
  echo "[gpu-check] no GPU here (neither nvidia-smi nor NVML): ran the CPU part only"
  exit 0
fi
if ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "[gpu-check] NVML is here but torch has no CUDA: ran the CPU part only"
  exit 0
fi
echo "[gpu-check] NVML idle vs busy and py-spy stacks of CUDA processes (about 1 minute)"
timeout 300 "$python" "$repo/scripts/gpu_check.py" "$out"
gpu=$?
echo "[gpu-check] GPU part exited $gpu; outputs in $out"
exit "$gpu"
