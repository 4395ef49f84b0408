#!/usr/bin/env bash
# The whole suite with the learning and load tests at full size (minutes, not seconds).
# OPENCLAW_TEST_WORKERS=N: pytest-xdist workers (default: one process; the full learning runs are CPU-bound).
set -euo pipefail
cd "$(dirname "$0")/.."
OPENCLAW_SETUP_BROWSER=1 bash scripts/setup.sh  # with the browser for the dashboard test
# A private, fresh tiny-model build (tests/support.py private_model_build), as in a fresh clone
OPENCLAW_TEST_FULL=1 OPENCLAW_TEST_FRESH_MODEL=1 exec .venv/bin/python -m pytest -n "${OPENCLAW_TEST_WORKERS:-0}" "$@"
