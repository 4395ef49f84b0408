#!/usr/bin/env bash
# Install real SGLang 0.5.23 on CPU (scripts/install_sglang_cpu.sh) and run the optional check that
# `openclaw-rl train` trains what it serves: the proxy samples from SGLang, the embedded trainer updates
# the weights, and SGLang's own /update_weights_from_disk loads them under versioned labels.
# The server needs about 4 GB of RAM and 25-257 s to start (25-40 s measured on an idle 2-core machine,
# 104-257 s on a new user's); the install before it took 4-17 minutes. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OPENCLAW_SGLANG_PYTHON=$(bash scripts/install_sglang_cpu.sh)
export OPENCLAW_SGLANG_PYTHON
# test_real_sglang_lora.py: per-user adapters with --enable-lora (skips without an NVIDIA driver; docs/users.md).
exec .venv/bin/python -m pytest tests/external/test_real_sglang.py tests/external/test_real_sglang_lora.py -v -rs "$@"
