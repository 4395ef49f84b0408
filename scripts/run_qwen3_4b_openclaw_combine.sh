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

VARIANT=combine  # mode, defaults and Slime flags: its LaunchVariant in openclaw_rl/modes.py

# shellcheck source=lib/common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib/common.sh"
oc_main "$@"
