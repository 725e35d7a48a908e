#!/usr/bin/env bash
# Set up, lint, then run the whole test suite (real torchrun hangs included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --areal --vllm
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Everything but Slurm on three workers side by side (pytest-xdist): a real AReaL run waits far
# more than it computes (about half a core, measured), so they overlap with each other and with
# the rest. Then the Slurm tests, one after the other: they share the machine's munged and
# Slurm's ports, and an AReaL job on Slurm slowed by two neighbours outlived its time limit.
.venv/bin/python -m pytest -q -ra -n 3 --dist worksteal --durations=30 -m "not slurm" "$@"
.venv/bin/python -m pytest -q -ra --durations=15 -m slurm "$@"
