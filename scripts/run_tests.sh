#!/usr/bin/env bash
# Install what the tests need (scripts/setup.sh), then run the suite. Extra args go to pytest.
# Learning and load tests run in a reduced size here; scripts/run_full_tests.sh runs them in full.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
