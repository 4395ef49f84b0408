#!/usr/bin/env bash
# Create .venv (if needed) and install openclaw-rl with its CPU stack. Idempotent; re-running is cheap.
# CPU installs pin torch==2.13.0 (a CPU wheel here; an unpinned torch pulls a multi-GB CUDA build).
# GPU users: install torch/SGLang/Slime your way, then `pip install -e .[slime]` (no pin is forced).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.openclaw-setup-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
  echo "[setup] installing torch==2.13.0 (CPU) and openclaw-rl[local,test] into .venv"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[local,test]"
  touch "$stamp"
fi
# The dashboard's browser test (tests/dashboard/test_dashboard_browser.py) drives the system's Chromium through
# Playwright (no browser download). The test scripts (run_tests.sh, run_full_tests.sh) set
# OPENCLAW_SETUP_BROWSER=1: then Chromium is installed where it is missing and we may (root with apt-get);
# otherwise that test skips and says why. `run_local.sh` never installs a system package.
if [ "${OPENCLAW_SETUP_BROWSER:-}" = 1 ] && ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
    && command -v apt-get >/dev/null 2>&1; then
  echo "[setup] installing chromium from the system's packages (the dashboard's browser test)"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } \
      >/tmp/openclaw-chromium-install.log 2>&1; then
    echo "[setup] chromium could not be installed (see /tmp/openclaw-chromium-install.log): the browser test will skip"
  fi
fi
