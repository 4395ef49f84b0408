#!/usr/bin/env bash
# Drive every non-LoRA launch variant through a real Slime checkout's own code on CPU
# (tests/slime_plugins/test_slime_cpu.py; what runs and what is stubbed: docs/deployment.md).
#
#   bash scripts/check_slime_cpu.sh SLIME_DIR MEGATRON_DIR [BUNDLED_SLIME_DIR BUNDLED_MEGATRON_DIR]
#
# SLIME_DIR: a THUDM/slime checkout. MEGATRON_DIR: Megatron-LM at the commit Slime's docker/Dockerfile pins
# (MEGATRON_COMMIT), with docker/patch/latest/megatron*.patch applied, as Slime's image does.
# BUNDLED_*: optionally, the slime/ and Megatron-LM/ trees shipped in Gen-Verse/OpenClaw-RL, as they are;
# the same tests then run against that Slime too (the in-trainer teacher's need the slime/ tree of f48ac35,
# whose actor passes the rollout data to the postprocess hook; with 0d034dd's they skip). Either pair may be '-' '-' to skip it. Slime's Python
# dependencies that install on CPU (ray, psutil, six, triton, requests) go into a venv of this checkout,
# CHECK_VENV [.cache/slime-cpu-venv, git-ignored], that reuses this project's .venv (run scripts/setup.sh
# first) for everything else. OPENCLAW_CHECK_PORTS [29700-29899]: the range the check's servers listen in.
# Getting the checkouts (the Megatron pin and patches) and what runs: docs/deployment.md (CPU integration check).
# Each passing test prints its numbers ([slime-cpu] lines: losses, max |loss diff| of TP=2 vs TP=1). A subset:
# PYTEST_ADDOPTS='-k topk_select' (pytest reads it).
set -euo pipefail
if (($# != 2 && $# != 4)); then
  sed -n '2,/^set -euo/p' "$0" | sed -n 's/^# \{0,1\}//p' >&2
  exit 2
fi
REPO_ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
SLIME_DIR="" MEGATRON_DIR="" BUNDLED_SLIME_DIR="" BUNDLED_MEGATRON_DIR=""
if [[ $1 != - ]]; then SLIME_DIR="$(cd -- "$1" && pwd)" MEGATRON_DIR="$(cd -- "$2" && pwd)"; fi
if (($# == 4)) && [[ $3 != - ]]; then BUNDLED_SLIME_DIR="$(cd -- "$3" && pwd)" BUNDLED_MEGATRON_DIR="$(cd -- "$4" && pwd)"; fi
for dir in "${SLIME_DIR}" "${BUNDLED_SLIME_DIR}"; do
  [[ -z ${dir} || -f ${dir}/train_async.py ]] || { echo "no train_async.py in ${dir}" >&2; exit 2; }
done
for dir in "${MEGATRON_DIR}" "${BUNDLED_MEGATRON_DIR}"; do
  [[ -z ${dir} || -d ${dir}/megatron/core ]] || { echo "no megatron/core in ${dir}" >&2; exit 2; }
done
BASE_PYTHON="${REPO_ROOT}/.venv/bin/python"
[[ -x ${BASE_PYTHON} ]] || { echo "run scripts/setup.sh first (needs ${BASE_PYTHON})" >&2; exit 2; }
CHECK_VENV=${CHECK_VENV:-${REPO_ROOT}/.cache/slime-cpu-venv}  # this checkout's own (it was one shared /tmp path)
[[ -x ${CHECK_VENV}/bin/python ]] || "${BASE_PYTHON}" -m venv "${CHECK_VENV}"
# Rewritten every time: a venv left by another checkout of this repository would point at its .venv.
site=$("${BASE_PYTHON}" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
venv_site=$("${CHECK_VENV}/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf '%s\n' "${site}" >"${venv_site}/openclaw_deps.pth"
"${CHECK_VENV}/bin/python" -m pip install -q ray psutil six triton requests
for dir in "${SLIME_DIR}" "${MEGATRON_DIR}" "${BUNDLED_SLIME_DIR}" "${BUNDLED_MEGATRON_DIR}"; do
  [[ -z ${dir} ]] || printf '%s (%s)\n' "${dir}" "$(git -C "${dir}" rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout')"
done
cd "${REPO_ROOT}"
OPENCLAW_SLIME_DIR="${SLIME_DIR}" OPENCLAW_MEGATRON_DIR="${MEGATRON_DIR}" \
  OPENCLAW_BUNDLED_SLIME_DIR="${BUNDLED_SLIME_DIR}" OPENCLAW_BUNDLED_MEGATRON_DIR="${BUNDLED_MEGATRON_DIR}" \
  OPENCLAW_SLIME_PYTHON="${CHECK_VENV}/bin/python" \
  RAY_AUTH_MODE=disabled exec "${BASE_PYTHON}" -m pytest tests/slime_plugins/test_slime_cpu.py -v -p no:cacheprovider -rsP
