#!/usr/bin/env bash
# The whole suite with the learning and load tests at full size (minutes, not seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OPENCLAW_TEST_FULL=1 exec .venv/bin/python -m pytest "$@"
