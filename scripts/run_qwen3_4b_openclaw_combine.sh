#!/usr/bin/env bash
# Combined RL + OPD (mode combine) for Qwen3-4B on Slime, full-parameter Megatron. Each turn's judge
# votes give a +1/-1 reward and, when a hint is accepted, teacher log-probs; one PPO step trains on
# A_t = w_opd * (teacher_t - old_t) + w_rl * r (openclaw_combine.loss.combine_loss_function).
# Weights: OPENCLAW_COMBINE_W_RL / OPENCLAW_COMBINE_W_OPD (1.0). Upstream:
# openclaw-combine/run_qwen3_4b_openclaw_combine.sh (without its hard-coded personal data paths).
#
# Default layout, NUM_GPUS=8: ACTOR_GPUS=4, ROLLOUT_GPUS=2, PRM_GPUS=2 (judge and teacher).
#
#   cd /path/to/slime && bash /path/to/openclaw-rl/scripts/run_qwen3_4b_openclaw_combine.sh
#   DRY_RUN=1 bash .../run_qwen3_4b_openclaw_combine.sh   # or --dry-run
set -euo pipefail

VARIANT=combine MODE=combine LORA=0
OC_TRAINS="PPO on w_opd*(teacher - old) + w_rl*r (Megatron, full parameters)"
DEF_NUM_GPUS=8 DEF_ACTOR_GPUS=4 DEF_ROLLOUT_GPUS=2 DEF_PRM_GPUS=2 DEF_TP=2
DEF_PRM_M=1 DEF_PRM_MAX_NEW_TOKENS=8192 DEF_MEM_FRACTION=0.8
DEF_ROLLOUT_BATCH_SIZE=16 DEF_LR=1e-5 DEF_SAVE_INTERVAL=100
DEF_EVAL_MODE=1 DEF_TEACHER_CONCURRENCY=1 DEF_DISTILL_TOPK=0
WANDB_GROUP=qwen3-4b-openclaw-combine

oc_algorithm_args() {  # upstream's COMBINE_ARGS
  oc_grpo_args
  ALGO_ARGS+=(--loss-type custom_loss --custom-loss-function-path openclaw_combine.loss.combine_loss_function)
}

# shellcheck source=lib/common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib/common.sh"
oc_main "$@"
