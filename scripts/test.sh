#!/usr/bin/env bash
# Set up, lint, then run the whole test suite (real torchrun hangs included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --areal --vllm
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Three workers side by side (pytest-xdist): the real AReaL runs wait far more than they compute
# (about half a core each, measured), so they overlap with each other and with the rest; the
# Slurm tests stay together on one worker (conftest.py).
.venv/bin/python -m pytest -q -ra -n 3 --dist loadgroup "$@"
