#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv with everything the demo and the
# tests need. Idempotent: a second run installs nothing new.
#
#   bash scripts/setup.sh           # areal-watchdog and its test tools
#   bash scripts/setup.sh --areal   # also the real AReaL package (the AReaL tests and demo): 1.0.4
#                                   # from PyPI in .venv, and 2.0.0 in .venv-areal2 when the
#                                   # wheel built from AReaL's v2.0.0 tag is at $AREAL2_WHEEL
#                                   # (default ../shared/vendor/areal-2.0.0-py3-none-any.whl)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${AREAL_WATCHDOG_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
AREAL_VERSION=1.0.4
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
if [ "${1:-}" = "--areal" ] \
  && ! "$VENV/bin/python" -c "import areal, math_verify, peft, torchdata" >/dev/null 2>&1; then
  # AReaL pins torch<2.11, which is not to be had here: areal and the packages that would pull
  # another torch come without their dependencies (requirements-areal.txt says why).
  echo "[setup] installing AReaL $AREAL_VERSION (--no-deps) and its pure-Python dependencies"
  "${PIP[@]}" -r requirements-areal.txt
  "${PIP[@]}" --no-deps "areal==$AREAL_VERSION" "peft==0.18.1" "torchdata==0.11.0"
fi

# AReaL 2.0.0 beside it: a venv of its own whose only package is AReaL 2.0.0 (--no-deps, from the
# wheel built from AReaL's v2.0.0 tag); everything else, areal-watchdog included, comes from
# .venv through a .pth (site.addsitedir: .venv's own .pth files count too). Its AReaL shadows
# .venv's 1.0.4.
AREAL2_WHEEL="${AREAL2_WHEEL:-../shared/vendor/areal-2.0.0-py3-none-any.whl}"
VENV2="${AREAL_WATCHDOG_VENV2:-.venv-areal2}"
if [ "${1:-}" = "--areal" ] && [ -f "$AREAL2_WHEEL" ] \
  && ! "$VENV2/bin/python" -c "import areal, sys; sys.exit(areal.__version__ != '2.0.0')" \
    >/dev/null 2>&1; then
  echo "[setup] installing AReaL 2.0.0 (--no-deps) into $VENV2 from $AREAL2_WHEEL"
  "$VENV/bin/python" -m venv "$VENV2"
  purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
  base=$("$VENV/bin/python" -c "$purelib")
  echo "import site; site.addsitedir('$base')" > "$("$VENV2/bin/python" -c "$purelib")/areal-watchdog-base.pth"
  "$VENV2/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$AREAL2_WHEEL"
fi
