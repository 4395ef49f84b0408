#!/usr/bin/env bash
# Binary RL (mode rl) for Qwen3-4B on Slime, full-parameter Megatron training. The judge votes m times
# on each turn's next state; the majority (+1/-1) is the reward and GRPO trains with A = r on every
# response token (Slime's built-in PPO loss). Upstream: openclaw-rl/run_qwen3_4b_openclaw_rl.sh.
#
# Default layout, NUM_GPUS=8: ACTOR_GPUS=4 (Megatron TP 4), ROLLOUT_GPUS=2 (SGLang TP 2),
# PRM_GPUS=2 (the judge, an SGLang server this script starts). Smaller layouts: docs/deployment.md.
#
#   cd /path/to/slime && bash /path/to/openclaw-rl/scripts/run_qwen3_4b_openclaw_rl.sh
#   DRY_RUN=1 bash .../run_qwen3_4b_openclaw_rl.sh     # or --dry-run: print everything, start nothing
#
# Settings are environment variables (HF_CKPT, PRM_URL, SGLANG_API_KEY, ...): scripts/lib/common.sh.
set -euo pipefail

VARIANT=rl  # mode, defaults and Slime flags: its LaunchVariant in openclaw_rl/modes.py

# shellcheck source=lib/common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib/common.sh"
oc_main "$@"
