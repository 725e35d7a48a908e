#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv with everything the demo and the
# tests need. Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${AREAL_WATCHDOG_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# The CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "[setup] installing torch (CPU build)"
  "${PIP[@]}" "torch==2.13.0"
fi
echo "[setup] installing areal-watchdog and its test tools"
"${PIP[@]}" -e ".[test]"
