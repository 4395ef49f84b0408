#!/usr/bin/env bash
# Install what the tests need (scripts/setup.sh), then run the suite. Extra args go to pytest.
# Learning and load tests run in a reduced size here; scripts/run_full_tests.sh runs them in full.
# OPENCLAW_TEST_WORKERS=N runs N pytest-xdist workers (the suite is isolation-safe with -n 2); the default
# is one process: on a shared 2-core machine two workers measured slower (tests/core + tests/durability:
# 347 s vs 295 s wall, 249 vs 211 CPU s), so only use them where cores are idle.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -n "${OPENCLAW_TEST_WORKERS:-0}" "$@"
