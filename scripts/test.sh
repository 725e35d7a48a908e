#!/usr/bin/env bash
# Set up, lint, then run the whole test suite (real torchrun hangs included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --areal --vllm
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # the files and settings are in pyproject.toml
# Everything but Slurm on three workers side by side (pytest-xdist): a real AReaL run waits far
# more than it computes (about half a core, measured), so they overlap with each other and with
# the rest. The Slurm tests after them: an AReaL job on Slurm slowed by two neighbours of the
# first phase once outlived its time limit.
.venv/bin/python -m pytest -q -ra -n 3 --dist worksteal --durations=30 -m "not slurm and not fleet and not beside_slurm" "$@"
# The AReaL jobs on Slurm clusters in network namespaces of their own (the single controller's in
# tests/test_areal.py, SPMD's in tests/test_areal_on_slurm.py), the other Slurm tests on the
# default cluster: the three files side by side (a worker each), the clusters apart by network
# namespace and job ids, sharing the machine's munged, started here so that no cluster's teardown
# ends it under another. The real-sidecar fleet (counts, timings) and the check-workflow module
# (one vLLM server for its five tests, kept on one worker by loadfile) join them there, where the
# CPU is mostly idle.
munge_dir="$(mktemp -d)"
trap 'AREAL_SLURM_DIR="$munge_dir" bash scripts/slurm-cluster.sh down >/dev/null 2>&1 || true' EXIT
if [ "$(id -u)" -eq 0 ] && command -v munged >/dev/null; then
  AREAL_SLURM_DIR="$munge_dir" bash scripts/slurm-cluster.sh munge
fi
.venv/bin/python -m pytest -q -ra -n 3 --dist loadfile --durations=15 -m "slurm or fleet or beside_slurm" "$@"
