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

VARIANT=opd_topk  # mode, defaults and Slime flags: its LaunchVariant in openclaw_rl/modes.py

# shellcheck source=lib/common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib/common.sh"
oc_main "$@"
