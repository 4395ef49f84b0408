#!/usr/bin/env bash
# On-policy distillation (mode opd, token level) for Qwen3-4B on Slime, full-parameter Megatron.
# When the judge extracts a hint from a turn's next state, the teacher (the judge model, prompt + hint)
# scores the same response; the advantage is A_t = teacher_t - old_t on every response token and
# Slime's built-in PPO loss trains on it. Upstream: openclaw-opd/run_qwen3_4b_openclaw_opd.sh.
#
# The advantage comes from one of two places (OPD_ADVANTAGE, printed at start):
#   estimator  --advantage-estimator on_policy_distillation   (OpenClaw-RL's bundled Slime)
#   custom     --custom-advantage-function-path openclaw_opd.loss.on_policy_distillation_advantages
#              (THUDM/slime; the same arithmetic)
#   auto       (default) whichever the Slime checkout in SLIME_DIR has
#
# Default layout, NUM_GPUS=8: ACTOR_GPUS=4, ROLLOUT_GPUS=2, PRM_GPUS=2 (judge and teacher, one server).
#
#   cd /path/to/slime && bash /path/to/openclaw-rl/scripts/run_qwen3_4b_openclaw_opd.sh
#   DRY_RUN=1 bash .../run_qwen3_4b_openclaw_opd.sh     # or --dry-run
set -euo pipefail

VARIANT=opd MODE=opd LORA=0
OC_TRAINS="token-level OPD, A = teacher - old (Megatron, full parameters)"
DEF_NUM_GPUS=8 DEF_ACTOR_GPUS=4 DEF_ROLLOUT_GPUS=2 DEF_PRM_GPUS=2 DEF_TP=2
DEF_PRM_M=1 DEF_PRM_MAX_NEW_TOKENS=8192 DEF_MEM_FRACTION=0.8
DEF_ROLLOUT_BATCH_SIZE=16 DEF_LR=1e-5 DEF_SAVE_INTERVAL=100
DEF_EVAL_MODE=1 DEF_TEACHER_CONCURRENCY=1 DEF_DISTILL_TOPK=0
WANDB_GROUP=qwen3-4b-openclaw-opd

oc_algorithm_args() {  # upstream's OPD_ARGS
  if [[ ${OPD_ADVANTAGE} == estimator ]]; then
    ALGO_ARGS=(--advantage-estimator on_policy_distillation)
  else
    # The hook replaces Slime's advantage computation; rewards (the eval score) are not used.
    ALGO_ARGS=(
      --advantage-estimator grpo
      --disable-rewards-normalization
      --custom-advantage-function-path openclaw_opd.loss.on_policy_distillation_advantages
    )
  fi
  ALGO_ARGS+=(--entropy-coef 0.00)
  oc_add_kl_args
}

# shellcheck source=lib/common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib/common.sh"
oc_main "$@"
