#!/usr/bin/env bash
# Binary RL (mode rl) for Qwen3.5-4B on Slime, full-parameter Megatron: as run_qwen3_4b_openclaw_rl.sh
# (the judge's majority +1/-1 is the reward, GRPO with A = r).
# Qwen3.5: Megatron shape from Slime's scripts/models/qwen3.5-4B.sh (needs a Slime with slime_plugins.models.qwen3_5,
# e.g. OpenClaw-RL's bundled one), HF_CKPT [models/Qwen3.5-4B], ROTARY_BASE [10000000], model id qwen3.5-4b,
# TOOL_CALL_PARSER [qwen3_coder: XML-style tool calls, the proxy's chat format "qwen35"].
# Upstream: openclaw-rl/run_qwen35_4b_openclaw_rl.sh (ngquochuy0101/OpenClaw-RL f48ac35).
#
# Default layout, NUM_GPUS=8: ACTOR_GPUS=4, ROLLOUT_GPUS=2, PRM_GPUS=2 (judge).
#
#   cd /path/to/slime && bash /path/to/openclaw-rl/scripts/run_qwen35_4b_openclaw_rl.sh
#   DRY_RUN=1 bash .../run_qwen35_4b_openclaw_rl.sh   # or --dry-run
set -euo pipefail

VARIANT=qwen35_rl  # mode, defaults and Slime flags: its LaunchVariant in openclaw_rl/modes.py

# shellcheck source=lib/common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib/common.sh"
oc_main "$@"
