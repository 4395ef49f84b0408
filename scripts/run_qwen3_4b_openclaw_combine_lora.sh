#!/usr/bin/env bash
# Combined RL + OPD with LoRA: REFUSED by default, because it cannot train what it names.
#
# Upstream's openclaw-combine/run_qwen3_4b_openclaw_combine_lora.sh ran Slime's FSDP/LoRA backend, which
# implements only GRPO with its built-in loss and ignores combine_loss_function and the teacher
# log-probs: it silently trained GRPO on the judge's score alone.
#
# ALLOW_LORA_FALLBACK=1 runs that approximation knowingly and says so: combine with the OPD weight set
# to zero, i.e. A = w_rl * r with w_opd = 0 written into the run config. That objective is exactly what
# FSDP's GRPO computes on combine's samples (hint-only samples have r = 0 and contribute nothing), so
# the run is what the config says. The teacher signal the proxy collects is not used. For that, run
# scripts/run_qwen3_4b_openclaw_combine.sh; for LoRA binary RL, scripts/run_qwen3_4b_openclaw_rl_lora.sh.
#
# Default layout, NUM_GPUS=4: ACTOR_GPUS=2 (FSDP), ROLLOUT_GPUS=1, PRM_GPUS=1.
#   ALLOW_LORA_FALLBACK=1 bash /path/to/openclaw-rl/scripts/run_qwen3_4b_openclaw_combine_lora.sh
set -euo pipefail

VARIANT=combine_lora  # mode, defaults and Slime flags: its LaunchVariant in openclaw_rl/modes.py

# The refusal (and combine's ALLOW_LORA_FALLBACK) is checked by openclaw_rl/launch/refusals.py.

# shellcheck source=lib/common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib/common.sh"
oc_main "$@"
