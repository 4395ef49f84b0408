#!/usr/bin/env bash
# Install what the tests need (scripts/setup.sh), then run the suite. Extra args go to pytest.
# Learning and load tests run in a reduced size here; scripts/run_full_tests.sh runs them in full.
# Two pytest-xdist workers (OPENCLAW_TEST_WORKERS, 0 = one process): the suite waits on subprocesses and
# servers much of the time, so two cores overlap those waits; `worksteal` rebalances the long tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -n "${OPENCLAW_TEST_WORKERS:-2}" --dist worksteal "$@"
