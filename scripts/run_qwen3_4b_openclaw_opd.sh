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

VARIANT=opd  # mode, defaults and Slime flags: its LaunchVariant in openclaw_rl/modes.py

# shellcheck source=lib/common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib/common.sh"
oc_main "$@"
