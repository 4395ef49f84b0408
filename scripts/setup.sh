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
