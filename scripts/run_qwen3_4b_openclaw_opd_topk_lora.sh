#!/usr/bin/env bash
# Top-K on-policy distillation with LoRA: REFUSED, always. Kept so that upstream users who start it get
# an explanation instead of a silent substitute.
#
# Upstream's openclaw-opd/run_qwen3_4b_openclaw_opd_topk_lora.sh ran Slime's FSDP/LoRA backend, which
# implements only GRPO with its built-in loss: it ignores --loss-type custom_loss, the teacher top-K
# fields and --disable-compute-advantages-and-returns. So that script trained plain GRPO on the
# constant reward of accepted turns (self-imitation), never distillation, and said nothing. No honest
# approximation of distillation exists inside GRPO, so ALLOW_LORA_FALLBACK does not apply here.
# The alternatives are printed when the script is run.
set -euo pipefail

VARIANT=opd_topk_lora  # mode, defaults and Slime flags: its LaunchVariant in openclaw_rl/modes.py

# The refusal (and combine's ALLOW_LORA_FALLBACK) is checked by openclaw_rl/launch/refusals.py.

# shellcheck source=lib/common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib/common.sh"
oc_main "$@"
