#!/usr/bin/env bash
# Install what the embedded stack needs (scripts/setup.sh), then train the tiny policy online on this
# CPU with simulated users: `openclaw-rl local --mode rl --simulate`. Extra args go to `openclaw-rl local`
# (e.g. --mode opd, --mode combine, --interactions 400). Ctrl-C stops everything cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/openclaw-rl local --simulate "$@"
