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

VARIANT=rl MODE=rl LORA=0
OC_TRAINS="GRPO on the judge's +1/-1 score (Megatron, full parameters)"
DEF_NUM_GPUS=8 DEF_ACTOR_GPUS=4 DEF_ROLLOUT_GPUS=2 DEF_PRM_GPUS=2 DEF_TP=2
DEF_PRM_M=3 DEF_PRM_MAX_NEW_TOKENS=4096 DEF_MEM_FRACTION=0.85
DEF_ROLLOUT_BATCH_SIZE=16 DEF_LR=1e-5 DEF_SAVE_INTERVAL=100
WANDB_GROUP=qwen3-4b-openclaw-rl

oc_algorithm_args() {  # upstream's GRPO_ARGS
  oc_grpo_args
}

# shellcheck source=lib/common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib/common.sh"
oc_main "$@"
