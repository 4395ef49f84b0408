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

oc_variant_checks() {
  oc_die "run_qwen3_4b_openclaw_opd_topk_lora.sh refuses to run: it would not train top-K distillation.
  Slime's FSDP/LoRA backend implements only GRPO with its built-in loss; it ignores the custom top-K
  loss, the teacher's top-K log-probs and --disable-compute-advantages-and-returns. Upstream's version
  of this script therefore trained plain GRPO on a constant reward (self-imitation of accepted turns)
  without saying so. Distillation cannot be expressed as a GRPO reward, so there is no honest fallback
  and ALLOW_LORA_FALLBACK does not change this.
  Alternatives:
    - scripts/run_qwen3_4b_openclaw_opd_topk.sh: the same method, full-parameter Megatron (8 GPUs by
      default; with an external teacher, PRM_URL=http://host:port PRM_GPUS=0, 6 GPUs).
    - scripts/run_qwen3_4b_openclaw_opd.sh: token-level OPD, full-parameter Megatron.
    - scripts/run_qwen3_4b_openclaw_rl_lora.sh: LoRA with a method the FSDP backend implements (binary RL).
  See docs/deployment.md (LoRA)."
}

# shellcheck source=lib/common.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib/common.sh"
oc_main "$@"
