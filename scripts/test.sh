#!/usr/bin/env bash
# Set up, lint, then run the whole test suite (real torchrun hangs included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --areal --vllm
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m pytest -q -ra "$@"
