#!/usr/bin/env bash
# On-policy distillation with the teacher's top-K logits (mode opd, K=50) for Qwen3-4B on Slime,
# full-parameter Megatron: reverse KL from the student to the teacher over the teacher's top-K tokens
# plus one tail bin (openclaw_opd.loss.topk_distillation_loss_function as Slime's custom loss).
# Upstream: openclaw-opd/run_qwen3_4b_openclaw_opd_topk.sh, with two fixes:
#   * --disable-rewards-normalization: upstream normalised the constant reward 1.0, so Slime dropped
#     every "constant" singleton group but one and trained on 1 sample of 4;
#   * SAVE_INTERVAL defaults to 100, not 1 (a full 4B checkpoint plus optimizer state every step).
# Runs on THUDM/slime as it is: Slime forwards only teacher_log_probs to the loss, so each sample's top-K
# rides inside it ([R, 1 + 2K] rows) and --rollout-data-postprocess-path unpacks it on the actor before
# Slime logs or trains (openclaw_rl/slime_hooks/topk.py, docs/hooks.md). Context parallelism must stay 1.
#
# Default layout, NUM_GPUS=8: ACTOR_GPUS=4, ROLLOUT_GPUS=2, PRM_GPUS=2 (judge and teacher).
#
#   cd /path/to/slime && bash /path/to/openclaw-rl/scripts/run_qwen3_4b_openclaw_opd_topk.sh
#   DRY_RUN=1 bash .../run_qwen3_4b_openclaw_opd_topk.sh   # or --dry-run
set -euo pipefail

VARIANT=opd_topk MODE=opd LORA=0
OC_TRAINS="top-K (K=50) reverse-KL distillation to the hinted teacher (Megatron, full parameters)"
DEF_NUM_GPUS=8 DEF_ACTOR_GPUS=4 DEF_ROLLOUT_GPUS=2 DEF_PRM_GPUS=2 DEF_TP=2
DEF_PRM_M=3 DEF_PRM_MAX_NEW_TOKENS=8192 DEF_MEM_FRACTION=0.85
DEF_ROLLOUT_BATCH_SIZE=4 DEF_LR=1e-6 DEF_SAVE_INTERVAL=100
DEF_EVAL_MODE=0 DEF_TEACHER_CONCURRENCY=3 DEF_DISTILL_TOPK=50
WANDB_GROUP=qwen3-4b-openclaw-opd-topk

oc_algorithm_args() {  # upstream's OPD_ARGS (the teacher's K comes from openclaw_opd_distill_topk)
  ALGO_ARGS=(
    --loss-type custom_loss
    --custom-loss-function-path openclaw_opd.loss.topk_distillation_loss_function
    --rollout-data-postprocess-path openclaw_rl.slime_hooks.topk.unpack_teacher_topk
    --disable-compute-advantages-and-returns
    --disable-rewards-normalization
    --entropy-coef 0.00
  )
}

# shellcheck source=lib/common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib/common.sh"
oc_main "$@"
