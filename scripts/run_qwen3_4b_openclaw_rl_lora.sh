#!/usr/bin/env bash
# Binary RL (mode rl) for Qwen3-4B with LoRA, on Slime's FSDP backend. Only the Slime bundled in
# Gen-Verse/OpenClaw-RL has an FSDP backend with LoRA; THUDM/slime (checked at 624b824) has neither FSDP
# nor LoRA, and this script refuses to start on it (openclaw_rl.slime_hooks.features).
# GRPO is exactly what that backend implements (its built-in PPO loss, A = r), so this variant trains
# the method it names. Adapters only are saved ($SAVE_CKPT/.../adapter_weights.pt). Upstream:
# openclaw-rl/run_qwen3_4b_openclaw_rl_lora.sh.
#
# Default layout, NUM_GPUS=4: ACTOR_GPUS=2 (FSDP), ROLLOUT_GPUS=1 (SGLang TP $TP=1), PRM_GPUS=1 (judge,
# TP $PRM_TP=$TP). With an external judge (PRM_URL=...) 3 GPUs are enough: see docs/deployment.md.
#
#   cd /path/to/slime && bash /path/to/openclaw-rl/scripts/run_qwen3_4b_openclaw_rl_lora.sh
#   DRY_RUN=1 bash .../run_qwen3_4b_openclaw_rl_lora.sh  # or --dry-run
set -euo pipefail

VARIANT=rl_lora  # mode, defaults and Slime flags: its LaunchVariant in openclaw_rl/modes.py

# shellcheck source=lib/common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib/common.sh"
oc_main "$@"
