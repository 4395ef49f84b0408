#!/usr/bin/env bash
# Install what the tests need (scripts/setup.sh), then run the suite. Extra args go to pytest.
# Learning and load tests run in a reduced size here; scripts/run_full_tests.sh runs them in full.
# OPENCLAW_TEST_WORKERS=N runs N pytest-xdist workers; the default is 2 where the machine has 2 or more CPUs
# (on a quiet 2-core machine, fresh clone, cold model build: 272 s with 2 workers against 444 s in one
# process), 0 (one process) otherwise. On a machine whose cores are busy with other work, one process can
# be faster: OPENCLAW_TEST_WORKERS=0.
set -euo pipefail
cd "$(dirname "$0")/.."
OPENCLAW_SETUP_BROWSER=1 bash scripts/setup.sh  # with the browser for the dashboard test
# --maxschedchunk 1: a worker is handed one test at a time, in the suite's order (tests/conftest.py), so the
# long tests near the end spread over both workers instead of queueing on one in the chunk it was sent
# (warm, quiet machine: 254 s with one worker idle for its last 80 s, 218 s with this).
cpus=$(nproc 2>/dev/null || echo 1)
workers=${OPENCLAW_TEST_WORKERS:-$((cpus >= 2 ? 2 : 0))}
if [ "${workers}" = 0 ]; then
  exec .venv/bin/python -m pytest -n 0 "$@"
fi
exec .venv/bin/python -m pytest -n "${workers}" --maxschedchunk 1 "$@"
