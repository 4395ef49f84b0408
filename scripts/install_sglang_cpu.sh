#!/usr/bin/env bash
# Install real SGLang 0.5.23 into its own venv (.sglang-venv, gitignored) for the optional real-SGLang
# check on a machine without a GPU. Idempotent. It is big and slow (about 11 GB; measured 4 to 17 minutes,
# the 17 on a new user's machine, so plan for a quarter of an hour: SGLang pins torch==2.14.1, the CUDA 13 build, plus flashinfer, sgl-kernel and the nvidia-* libraries),
# which is why the project's own .venv never depends on it. On CPU it only runs with
# `--model-impl transformers` (the native path imports vllm). See docs/deployment.md, "One GPU or a CPU".
# Prints the venv's python: export OPENCLAW_SGLANG_PYTHON=<that> to enable tests/external/test_real_sglang.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${SGLANG_VENV:-.sglang-venv}
SGLANG_VERSION=0.5.23
if ! "$VENV/bin/python" -c "import sglang, sys; sys.exit(sglang.__version__ != '$SGLANG_VERSION')" 2>/dev/null; then
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  echo "[sglang] installing sglang==$SGLANG_VERSION into $VENV (11 GB; measured 4-17 minutes)" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "sglang==$SGLANG_VERSION"
fi
"$VENV/bin/python" -c "import sglang; print('[sglang]', sglang.__version__)" >&2
echo "$(cd "$VENV" && pwd)/bin/python"
